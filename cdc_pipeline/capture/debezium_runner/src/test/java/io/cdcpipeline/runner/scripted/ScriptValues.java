package io.cdcpipeline.runner.scripted;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.sql.Date;
import java.sql.Time;
import java.sql.Timestamp;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.OffsetDateTime;
import java.time.format.DateTimeFormatter;
import java.time.format.DateTimeFormatterBuilder;
import java.time.temporal.ChronoField;
import java.util.HexFormat;
import java.util.Map;
import java.util.function.Function;

import com.fasterxml.jackson.databind.JsonNode;

/**
 * The Java object a script's value stands for: what the JDBC driver's {@code ResultSet.getObject} hands the
 * connector. A value is JSON {@code null}, a string ({@link String}), a boolean ({@link Boolean}), an integral number
 * ({@link Integer}, or {@link Long} beyond int), a fractional number ({@link Double}), {@code {"hex": "00ff"}}
 * ({@code byte[]}), or {@code {"java": CLASS, "value": TEXT}} for the classes in {@link #PARSERS}.
 */
final class ScriptValues {
    /** {@code yyyy-MM-dd HH:mm:ss[.fffffffff] +hh:mm}, SQL Server's text of a {@code datetimeoffset}. */
    private static final DateTimeFormatter OFFSET_TIMESTAMP = new DateTimeFormatterBuilder()
            .appendPattern("yyyy-MM-dd HH:mm:ss")
            .optionalStart().appendFraction(ChronoField.NANO_OF_SECOND, 0, 9, true).optionalEnd()
            .appendPattern(" xxx")
            .toFormatter();

    private static final Map<String, Function<String, Object>> PARSERS = Map.ofEntries(
            Map.entry("java.lang.String", text -> text),
            Map.entry("java.lang.Boolean", Boolean::valueOf),
            Map.entry("java.lang.Byte", Byte::valueOf),
            Map.entry("java.lang.Short", Short::valueOf),
            Map.entry("java.lang.Integer", Integer::valueOf),
            Map.entry("java.lang.Long", Long::valueOf),
            Map.entry("java.lang.Float", Float::valueOf),
            Map.entry("java.lang.Double", Double::valueOf),
            Map.entry("java.math.BigDecimal", BigDecimal::new),
            Map.entry("java.math.BigInteger", BigInteger::new),
            Map.entry("java.sql.Date", Date::valueOf),
            Map.entry("java.sql.Time", Time::valueOf),
            Map.entry("java.sql.Timestamp", Timestamp::valueOf),
            Map.entry("java.time.LocalDate", LocalDate::parse),
            Map.entry("java.time.LocalTime", LocalTime::parse),
            Map.entry("java.time.LocalDateTime", LocalDateTime::parse),
            Map.entry("java.time.OffsetDateTime", OffsetDateTime::parse),
            Map.entry("java.time.Instant", Instant::parse),
            Map.entry("microsoft.sql.DateTimeOffset", ScriptValues::dateTimeOffset));

    private ScriptValues() {
    }

    static Object javaValue(JsonNode node) {
        if (node == null || node.isNull()) {
            return null;
        }
        if (node.isTextual()) {
            return node.asText();
        }
        if (node.isBoolean()) {
            return node.booleanValue();
        }
        if (node.isIntegralNumber()) {
            return node.canConvertToInt() ? (Object) node.intValue() : (Object) node.longValue();
        }
        if (node.isNumber()) {
            return node.doubleValue();
        }
        if (node.has("hex")) {
            return HexFormat.of().parseHex(node.get("hex").asText());
        }
        if (node.has("java")) {
            String javaClass = node.get("java").asText();
            Function<String, Object> parser = PARSERS.get(javaClass);
            if (parser == null) {
                throw new IllegalArgumentException("no script value of Java class " + javaClass + "; known: " + PARSERS.keySet());
            }
            return parser.apply(node.get("value").asText());
        }
        throw new IllegalArgumentException("not a script value: " + node);
    }

    /** The driver's {@code microsoft.sql.DateTimeOffset} of the text: the UTC instant and the offset in minutes. */
    private static Object dateTimeOffset(String text) {
        OffsetDateTime value = OffsetDateTime.parse(text, OFFSET_TIMESTAMP);
        return microsoft.sql.DateTimeOffset.valueOf(Timestamp.from(value.toInstant()), value.getOffset().getTotalSeconds() / 60);
    }
}
