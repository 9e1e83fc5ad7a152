package io.cdcpipeline.runner;

import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.IdentityHashMap;
import java.util.Map;

import org.apache.kafka.connect.data.Decimal;
import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * Turns a Debezium record into one JSON line: {seq, topic, schema, key, value, partition, offset}.
 * Payloads are written without their schema; each distinct value schema gets a short id, and a batch
 * carries the schemas its lines use once, so the lines stay small and Spark parses them with one fixed schema.
 * Decimals are written as JSON strings in plain notation: as JSON numbers Spark's parser would read them
 * through a double and lose digits.
 */
final class EventSerializer {
    private final JsonConverter payloadConverter = new JsonConverter();
    private final JsonConverter schemaConverter = new JsonConverter();
    private final ObjectMapper mapper = new ObjectMapper();
    private final Map<Schema, String> idBySchema = new IdentityHashMap<>();
    private final Map<String, String> idByJson = new HashMap<>();
    private final Map<String, String> jsonById = new HashMap<>();
    private final Map<Schema, Schema> plainSchemas = new IdentityHashMap<>();

    EventSerializer() {
        Map<String, Object> config = new HashMap<>();
        config.put("schemas.enable", "false");
        config.put("converter.type", "value");
        payloadConverter.configure(config, false);
        Map<String, Object> schemaConfig = new HashMap<>(config);
        schemaConfig.put("schemas.enable", "true");
        schemaConverter.configure(schemaConfig, false);
    }

    String line(long seq, SourceRecord record) {
        StringBuilder out = new StringBuilder(512);
        out.append("{\"seq\":").append(seq)
                .append(",\"topic\":").append(json(record.topic()))
                .append(",\"schema\":").append(json(schemaId(record.valueSchema())))
                .append(",\"key\":").append(payload(record.topic(), record.keySchema(), record.key()))
                .append(",\"value\":").append(payload(record.topic(), record.valueSchema(), record.value()))
                .append(",\"partition\":").append(json(record.sourcePartition()))
                .append(",\"offset\":").append(json(record.sourceOffset()))
                .append('}');
        return out.toString();
    }

    String schemaJson(String id) {
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
        if (Decimal.LOGICAL_NAME.equals(schema.name())) {
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

    private String schemaId(Schema schema) {
        if (schema == null) {
            return null;
        }
        String id = idBySchema.get(schema);
        if (id == null) {
            String schemaJson = schemaConverter.asJsonSchema(schema).toString();
            id = idByJson.computeIfAbsent(schemaJson, unused -> "s" + (idByJson.size() + 1));
            jsonById.putIfAbsent(id, schemaJson);
            idBySchema.put(schema, id);
        }
        return id;
    }
}
