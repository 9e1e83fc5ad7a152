package io.cdcpipeline.runner;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.IdentityHashMap;
import java.util.Map;
import java.util.Set;

import org.apache.kafka.connect.data.Decimal;
import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeArrayWriter;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

import com.fasterxml.jackson.core.JsonEncoding;
import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import io.debezium.data.VariableScaleDecimal;

/**
 * Turns a Debezium record into what the pipeline reads of it: for a data change, a Spark row ({@link #DATA_ROW}:
 * seq, schema id, op, and each row image as a map from column to its value's text); on demand, the whole JSON line
 * {seq, topic, schema, key, value, partition, offset} (a dead letter keeps it).
 * A row image's values are the text Spark's {@code from_json} gives a {@code map<string,string>} of the image's JSON
 * payload (see {@link #valueText}): a row from the runner and a line parsed by Spark (a replayed dead letter's)
 * convert alike. Payloads are written without their schema; each distinct value schema gets a short id, and a
 * batch carries the schemas its rows use once.
 * Decimals (Connect Decimal and Debezium's VariableScaleDecimal) are written as strings in plain notation:
 * as JSON numbers Spark's parser would read them through a double and lose digits.
 * A value schema does not say which columns form the key, so the shipped copy of it marks each key column of
 * its row images with the parameter {@value #KEY_POSITION_PARAMETER} (the column's position in the record key);
 * the schema id covers the value schema and the key schema together.
 * Next to each line, an index entry tells the planner what it needs (kind, table, op, position) without Spark.
 */
final class EventSerializer {
    static final String KEY_POSITION_PARAMETER = "__cdc.key.position";
    static final String KIND_DATA_CHANGE = "data_change";
    static final String KIND_SCHEMA_CHANGE = "schema_change";
    static final String KIND_TRUNCATE = "truncate";
    static final String KIND_OTHER = "other";
    /**
     * A source transaction's BEGIN or END marker (`provide.transaction.metadata`): its entry holds `status` and the
     * transaction's `id` (and, for an END, its `event_count`).
     */
    static final String KIND_TRANSACTION = "transaction";
    /** The offset keys Debezium's transaction metadata adds (the transaction's id, each table's order in it). */
    private static final String TRANSACTION_OFFSET_PREFIX = "transaction_";
    private static final Set<String> DATA_OPS = Set.of("c", "r", "u", "d");
    private static final Set<String> UNINDEXED_SOURCE_FIELDS = Set.of("version", "connector", "name", "ts_us", "ts_ns");
    /** The row of a data change that Spark reads: what parsing its JSON line with the pipeline's fixed schema gives. */
    static final StructType DATA_ROW = new StructType()
            .add("seq", DataTypes.LongType)
            .add("schema", DataTypes.StringType)
            .add("op", DataTypes.StringType)
            .add("before", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType))
            .add("after", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType));
    private static final JsonFactory JSON = new JsonFactory();
    private static final String KAFKA_LOGICAL_PREFIX = "org.apache.kafka.connect.data.";

    private final JsonConverter payloadConverter = new JsonConverter();
    private final JsonConverter schemaConverter = new JsonConverter();
    private final ObjectMapper mapper = new ObjectMapper();
    private final Map<Schema, Map<Schema, String>> idBySchemas = new IdentityHashMap<>();
    private final Map<String, String> idByJson = new HashMap<>();
    private final Map<String, String> jsonById = new HashMap<>();
    private final Map<Schema, Schema> plainSchemas = new IdentityHashMap<>();
    private final Map<Schema, UTF8String[]> columnNames = new IdentityHashMap<>();
    /**
     * Writes rows of {@link #DATA_ROW} in Spark's own compact format (an {@link UnsafeRow}: one byte array each, which
     * the collector copies fast while they wait), as Spark's generated projection does, without its code generation
     * (about 0.3 s of a cold JVM, before the engine's first batch).
     */
    private UnsafeRowWriter rowWriter = new UnsafeRowWriter(DATA_ROW.size(), 512);
    private UnsafeArrayWriter arrayWriter = new UnsafeArrayWriter(rowWriter, 8);
    /** A row writer whose buffer grew past this many bytes (a row of large values) is replaced by a small one. */
    private static final int KEPT_BUFFER_BYTES = 1 << 20;

    EventSerializer() {
        Map<String, Object> config = new HashMap<>();
        config.put("schemas.enable", "false");
        config.put("converter.type", "value");
        payloadConverter.configure(config, false);
        Map<String, Object> schemaConfig = new HashMap<>(config);
        schemaConfig.put("schemas.enable", "true");
        schemaConverter.configure(schemaConfig, false);
    }

    /**
     * The row Spark reads of a data change ({@link #DATA_ROW}): seq, schema id, op and the row images, all the
     * pipeline needs of it. A third of the whole line's size (no key, source block, offset or partition); the whole
     * line is made only when asked for (a dead letter keeps it).
     */
    synchronized UnsafeRow dataRow(long seq, SourceRecord record) {
        Schema schema = record.valueSchema();
        Struct value = (Struct) record.value();
        rowWriter.reset();
        rowWriter.zeroOutNullBytes();
        rowWriter.write(0, seq);
        writeText(1, schemaId(schema, record.keySchema()));
        writeText(2, value.getString("op"));
        writeImage(3, record.topic(), schema, value, "before");
        writeImage(4, record.topic(), schema, value, "after");
        UnsafeRow row = rowWriter.getRow().copy();
        if (row.getSizeInBytes() > KEPT_BUFFER_BYTES) {
            // Its buffer would keep the largest row's size for the engine's life.
            rowWriter = new UnsafeRowWriter(DATA_ROW.size(), 512);
            arrayWriter = new UnsafeArrayWriter(rowWriter, 8);
        }
        return row;
    }

    private void writeText(int ordinal, String text) {
        if (text == null) {
            rowWriter.setNullAt(ordinal);
        }
        else {
            rowWriter.write(ordinal, UTF8String.fromString(text));
        }
    }

    /** A row image as a map<string,string>, laid out as Spark's UnsafeMapData: its keys' size, keys, values. */
    private void writeImage(int ordinal, String topic, Schema schema, Struct value, String name) {
        Field field = schema.field(name);
        Object image = field == null ? null : value.get(field);
        if (image == null) {
            rowWriter.setNullAt(ordinal);
            return;
        }
        Schema imageSchema = field.schema();
        List<Field> fields = imageSchema.fields();
        UTF8String[] names = columnNames.computeIfAbsent(imageSchema, unused -> {
            UTF8String[] out = new UTF8String[fields.size()];
            for (int i = 0; i < out.length; i++) {
                out[i] = UTF8String.fromString(fields.get(i).name());
            }
            return out;
        });
        int start = rowWriter.cursor();
        rowWriter.grow(8);
        rowWriter.increaseCursor(8);
        int keysStart = rowWriter.cursor();
        arrayWriter.initialize(names.length);
        for (int i = 0; i < names.length; i++) {
            arrayWriter.write(i, names[i]);
        }
        Platform.putLong(rowWriter.getBuffer(), keysStart - 8, rowWriter.cursor() - keysStart);
        Struct struct = (Struct) image;
        arrayWriter.initialize(names.length);
        for (int i = 0; i < names.length; i++) {
            Field column = fields.get(i);
            String text = valueText(topic, column.schema(), struct.get(column));
            if (text == null) {
                arrayWriter.setNull8Bytes(i);
            }
            else {
                arrayWriter.write(i, UTF8String.fromString(text));
            }
        }
        rowWriter.setOffsetAndSizeFromPreviousCursor(ordinal, start);
    }

    /**
     * A column's value as the text Spark's {@code from_json} reads for it from the payload's JSON into a
     * {@code map<string,string>}: a JSON string's content; a number, boolean, object or array as Spark's parser
     * writes the token again (numbers with a fraction through a double); null for null.
     * Common types are written directly; the rest (structs, arrays, Kafka's logical types) go through the JSON
     * converter and a Jackson copy of its token, as Spark does.
     */
    private String valueText(String topic, Schema schema, Object value) {
        if (value == null) {
            return null;
        }
        String logical = schema.name();
        if (Decimal.LOGICAL_NAME.equals(logical)) {
            return ((BigDecimal) value).toPlainString();
        }
        if (VariableScaleDecimal.LOGICAL_NAME.equals(logical)) {
            return variableScaleDecimalText((Struct) value);
        }
        // The converter writes Kafka's own logical types (Date, Time, Timestamp) its own way; other names
        // (Debezium's times, Json, Enum, Bits, ...) are plain values to it.
        if (logical == null || !logical.startsWith(KAFKA_LOGICAL_PREFIX)) {
            switch (schema.type()) {
                case STRING:
                    return (String) value;
                case INT8:
                case INT16:
                case INT32:
                case INT64:
                case BOOLEAN:
                    return value.toString();
                case FLOAT64:
                    return Double.toString((Double) value);
                case FLOAT32:
                    // The converter writes a float's own shortest text; Spark's parser reads it as a double.
                    return Double.toString(Double.parseDouble(Float.toString((Float) value)));
                case BYTES:
                    return Base64.getEncoder().encodeToString(bytes(value));
                default:
                    break;
            }
        }
        return tokenText(payload(topic, schema, value));
    }

    /** What Spark's JSON parser gives for one JSON value read as a string (its JacksonParser, StringType). */
    private static String tokenText(String json) {
        try (JsonParser parser = JSON.createParser(json)) {
            JsonToken token = parser.nextToken();
            if (token == null || token == JsonToken.VALUE_NULL) {
                return null;
            }
            if (token == JsonToken.VALUE_STRING) {
                return parser.getText();
            }
            ByteArrayOutputStream out = new ByteArrayOutputStream(json.length());
            try (JsonGenerator generator = JSON.createGenerator(out, JsonEncoding.UTF8)) {
                generator.copyCurrentStructure(parser);
            }
            return out.toString(StandardCharsets.UTF_8);
        }
        catch (IOException e) {
            throw new IllegalStateException("cannot read back a value written as JSON", e);
        }
    }

    private static byte[] bytes(Object value) {
        if (value instanceof ByteBuffer) {
            ByteBuffer buffer = ((ByteBuffer) value).duplicate();
            byte[] bytes = new byte[buffer.remaining()];
            buffer.get(bytes);
            return bytes;
        }
        return (byte[]) value;
    }

    synchronized String line(long seq, SourceRecord record) {
        StringBuilder out = new StringBuilder(512);
        out.append("{\"seq\":").append(seq)
                .append(",\"topic\":").append(json(record.topic()))
                .append(",\"schema\":").append(json(schemaId(record.valueSchema(), record.keySchema())))
                .append(",\"key\":").append(payload(record.topic(), record.keySchema(), record.key()))
                .append(",\"value\":").append(payload(record.topic(), record.valueSchema(), record.value()))
                .append(",\"partition\":").append(json(record.sourcePartition()))
                .append(",\"offset\":").append(json(publicOffset(record.sourceOffset())))
                .append('}');
        return out.toString();
    }

    /**
     * What the planner needs of a record without parsing its line: seq, kind, source table, schema id, op,
     * the source block (nulls and the connector's name and version left out), the offset, and for a schema
     * change its payload. The pipeline reads a batch's entries as one JSON array (see {@link ChangeBatch#index}).
     */
    /**
     * Whether a record belongs to the connector's initial snapshot: its source block says so (`snapshot` true,
     * first, last, ...; an incremental snapshot's reads are the stream's), or, for a record without one, its offset
     * was taken inside a snapshot that had not completed.
     */
    static boolean inSnapshot(SourceRecord record) {
        Schema schema = record.valueSchema();
        if (record.value() instanceof Struct && schema != null && schema.type() == Schema.Type.STRUCT
                && schema.field("source") != null) {
            Struct source = ((Struct) record.value()).getStruct("source");
            if (source != null && source.schema().field("snapshot") != null) {
                Object snapshot = source.get("snapshot");
                String marker = snapshot == null ? "false" : snapshot.toString().toLowerCase();
                return !marker.equals("false") && !marker.equals("incremental");
            }
        }
        Map<String, ?> offset = record.sourceOffset();
        if (offset == null) {
            return false;
        }
        Object snapshot = offset.get("snapshot");
        return snapshot != null && !"false".equalsIgnoreCase(snapshot.toString())
                && !"true".equalsIgnoreCase(String.valueOf(offset.get("snapshot_completed")));
    }

    synchronized ObjectNode indexEntry(long seq, SourceRecord record) {
        ObjectNode entry = mapper.createObjectNode();
        entry.put("seq", seq);
        String kind = KIND_OTHER;
        Schema schema = record.valueSchema();
        if (isTransactionMarker(record)) {
            Struct value = (Struct) record.value();
            kind = KIND_TRANSACTION;
            entry.put("status", value.getString("status"));
            entry.put("id", value.getString("id"));
            Object count = value.get("event_count");
            if (count != null) {
                entry.put("event_count", ((Number) count).longValue());
            }
        }
        else if (record.value() instanceof Struct && schema != null && schema.type() == Schema.Type.STRUCT) {
            Struct value = (Struct) record.value();
            entry.put("schema", schemaId(schema, record.keySchema()));
            Struct source = schema.field("source") == null ? null : value.getStruct("source");
            if (source != null) {
                entry.set("source", sourceNode(source));
            }
            if (schema.field("ddl") != null || schema.field("tableChanges") != null) {
                kind = KIND_SCHEMA_CHANGE;
                entry.set("change", schemaChange(record));
            }
            else {
                String op = schema.field("op") == null ? null : value.getString("op");
                entry.put("op", op);
                Object processedAt = schema.field("ts_ms") == null ? null : value.get("ts_ms");
                if (processedAt != null) {
                    entry.put("ts_ms", ((Number) processedAt).longValue());  // when Debezium processed the change
                }
                if (op != null && DATA_OPS.contains(op)) {
                    kind = KIND_DATA_CHANGE;
                }
                else if ("t".equals(op)) {
                    kind = KIND_TRUNCATE;
                }
                String table = source == null ? null : tableId(source);
                if (table != null) {
                    entry.put("table", table);
                }
            }
        }
        entry.put("kind", kind);
        entry.set("offset", mapper.valueToTree(publicOffset(record.sourceOffset())));
        return entry;
    }

    /**
     * Whether a value schema is Debezium's transaction metadata (the BEGIN and END records of
     * `provide.transaction.metadata`): status, id and event_count, and neither an op nor a source block.
     */
    static boolean isTransactionMarker(Schema schema) {
        return schema.type() == Schema.Type.STRUCT && schema.field("status") != null && schema.field("id") != null
                && schema.field("event_count") != null && schema.field("op") == null && schema.field("source") == null;
    }

    /**
     * A source offset without the keys transaction metadata adds to it (`transaction_id`, each table's order in the
     * transaction): the position the pipeline compares, records, and hands to a `set offset`. Two records of one
     * statement then share one offset again, as they do without the metadata. The same map when it has none.
     */
    static Map<String, ?> publicOffset(Map<String, ?> offset) {
        if (offset == null) {
            return null;
        }
        boolean has = false;
        for (String key : offset.keySet()) {
            if (key.startsWith(TRANSACTION_OFFSET_PREFIX)) {
                has = true;
                break;
            }
        }
        if (!has) {
            return offset;
        }
        Map<String, Object> kept = new java.util.LinkedHashMap<>();
        for (Map.Entry<String, ?> item : offset.entrySet()) {
            if (!item.getKey().startsWith(TRANSACTION_OFFSET_PREFIX)) {
                kept.put(item.getKey(), item.getValue());
            }
        }
        return kept;
    }

    /** Whether a record is a source transaction's BEGIN or END marker. */
    static boolean isTransactionMarker(SourceRecord record) {
        Schema schema = record.valueSchema();
        return record.value() instanceof Struct && schema != null && isTransactionMarker(schema);
    }

    /** Whether a record is a source transaction's END marker. */
    static boolean isTransactionEnd(SourceRecord record) {
        return isTransactionMarker(record) && "END".equals(((Struct) record.value()).getString("status"));
    }

    private ObjectNode sourceNode(Struct source) {
        ObjectNode node = mapper.createObjectNode();
        for (Field field : source.schema().fields()) {
            Object fieldValue = source.get(field);
            if (fieldValue != null && !UNINDEXED_SOURCE_FIELDS.contains(field.name())) {
                node.set(field.name(), mapper.valueToTree(fieldValue));
            }
        }
        return node;
    }

    /** `db.table`, or `schema.table` for sources with schemas (PostgreSQL, SQL Server, Oracle). */
    private static String tableId(Struct source) {
        Field tableField = source.schema().field("table");
        Object table = tableField == null ? null : source.get(tableField);
        if (table == null) {
            return null;
        }
        Field schemaField = source.schema().field("schema");
        Object container = schemaField != null ? source.get(schemaField) : source.schema().field("db") != null
                ? source.get("db") : null;
        return container == null ? table.toString() : container + "." + table;
    }

    private ObjectNode schemaChange(SourceRecord record) {
        JsonNode payload;
        try {
            payload = mapper.readTree(payload(record.topic(), record.valueSchema(), record.value()));
        }
        catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot read back a schema change written as JSON", e);
        }
        ObjectNode change = mapper.createObjectNode();
        change.set("databaseName", payload.path("databaseName").isMissingNode() ? null : payload.get("databaseName"));
        change.set("ddl", payload.path("ddl").isMissingNode() ? null : payload.get("ddl"));
        JsonNode tableChanges = payload.get("tableChanges");
        change.set("tableChanges", tableChanges == null || tableChanges.isNull() ? mapper.createArrayNode() : tableChanges);
        return change;
    }

    synchronized String schemaJson(String id) {
        return jsonById.get(id);
    }

    String json(Object value) {
        try {
            return mapper.writeValueAsString(value);
        }
        catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot write " + value + " as JSON", e);
        }
    }

    private String payload(String topic, Schema schema, Object value) {
        if (value == null) {
            return "null";
        }
        Schema plain = plainSchema(schema);
        Object plainValue = plainValue(schema, plain, value);
        return new String(payloadConverter.fromConnectData(topic, plain, plainValue), StandardCharsets.UTF_8);
    }

    /** The schema with every Decimal replaced by a string; the same instance when it has none. */
    private Schema plainSchema(Schema schema) {
        if (schema == null) {
            return null;
        }
        Schema cached = plainSchemas.get(schema);
        if (cached != null) {
            return cached;
        }
        Schema plain = schema;
        if (Decimal.LOGICAL_NAME.equals(schema.name()) || VariableScaleDecimal.LOGICAL_NAME.equals(schema.name())) {
            plain = schema.isOptional() ? Schema.OPTIONAL_STRING_SCHEMA : Schema.STRING_SCHEMA;
        }
        else if (schema.type() == Schema.Type.STRUCT) {
            boolean changed = false;
            SchemaBuilder builder = SchemaBuilder.struct().name(schema.name()).version(schema.version());
            if (schema.isOptional()) {
                builder.optional();
            }
            for (Field field : schema.fields()) {
                Schema fieldPlain = plainSchema(field.schema());
                changed |= fieldPlain != field.schema();
                builder.field(field.name(), fieldPlain);
            }
            plain = changed ? builder.build() : schema;
        }
        else if (schema.type() == Schema.Type.ARRAY) {
            Schema items = plainSchema(schema.valueSchema());
            if (items != schema.valueSchema()) {
                SchemaBuilder builder = SchemaBuilder.array(items).name(schema.name());
                plain = schema.isOptional() ? builder.optional().build() : builder.build();
            }
        }
        plainSchemas.put(schema, plain);
        return plain;
    }

    private Object plainValue(Schema schema, Schema plain, Object value) {
        if (value == null || schema == plain) {
            return value;
        }
        if (value instanceof BigDecimal) {
            return ((BigDecimal) value).toPlainString();
        }
        if (VariableScaleDecimal.LOGICAL_NAME.equals(schema.name())) {
            return variableScaleDecimalText((Struct) value);
        }
        if (value instanceof Struct) {
            Struct source = (Struct) value;
            Struct out = new Struct(plain);
            for (Field field : schema.fields()) {
                out.put(field.name(), plainValue(field.schema(), plain.field(field.name()).schema(), source.get(field)));
            }
            return out;
        }
        if (value instanceof List) {
            List<Object> out = new ArrayList<>();
            for (Object item : (List<?>) value) {
                out.add(plainValue(schema.valueSchema(), plain.valueSchema(), item));
            }
            return out;
        }
        return value;
    }

    private static String variableScaleDecimalText(Struct value) {
        int scale = value.getInt32(VariableScaleDecimal.SCALE_FIELD);
        return new BigDecimal(new BigInteger(bytes(value.get(VariableScaleDecimal.VALUE_FIELD))), scale).toPlainString();
    }

    private String schemaId(Schema valueSchema, Schema keySchema) {
        if (valueSchema == null) {
            return null;
        }
        Map<Schema, String> idByKeySchema = idBySchemas.computeIfAbsent(valueSchema, unused -> new IdentityHashMap<>());
        String id = idByKeySchema.get(keySchema);
        if (id == null) {
            ObjectNode schemaNode = schemaConverter.asJsonSchema(valueSchema).deepCopy();
            markKeyColumns(schemaNode, keySchema);
            String schemaJson = schemaNode.toString();
            id = idByJson.computeIfAbsent(schemaJson, unused -> "s" + (idByJson.size() + 1));
            jsonById.putIfAbsent(id, schemaJson);
            idByKeySchema.put(keySchema, id);
        }
        return id;
    }

    /** Marks the key columns of the schema's `before` and `after` structs with their position in the key. */
    private static void markKeyColumns(ObjectNode schemaNode, Schema keySchema) {
        if (keySchema == null || keySchema.type() != Schema.Type.STRUCT) {
            return;
        }
        Map<String, Integer> positions = new HashMap<>();
        for (Field field : keySchema.fields()) {
            positions.put(field.name(), field.index());
        }
        for (JsonNode image : schemaNode.path("fields")) {
            String imageName = image.path("field").asText();
            if (!"before".equals(imageName) && !"after".equals(imageName)) {
                continue;
            }
            for (JsonNode column : image.path("fields")) {
                Integer position = positions.get(column.path("field").asText());
                if (position != null && column instanceof ObjectNode) {
                    JsonNode parameters = column.get("parameters");
                    ObjectNode target = parameters instanceof ObjectNode
                            ? (ObjectNode) parameters : ((ObjectNode) column).putObject("parameters");
                    target.put(KEY_POSITION_PARAMETER, Integer.toString(position));
                }
            }
        }
    }
}
