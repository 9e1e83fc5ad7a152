package io.cdcpipeline.runner.scripted;

import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;

import io.debezium.config.Configuration;
import io.debezium.connector.oracle.OraclePartition;

/** Oracle's LogMiner streaming source replayed from a script (to come). */
final class OracleScript extends ScriptedSource<OraclePartition> {
    OracleScript(Configuration config) {
        super(config);
        throw new UnsupportedOperationException("the Oracle script is not written yet");
    }

    @Override
    OraclePartition partition() {
        return null;
    }

    @Override
    void loadOffset(Map<String, ?> storedOffset) {
    }

    @Override
    boolean delivered(int index) {
        return false;
    }

    @Override
    void recoverSchema(JsonNode step) {
    }

    @Override
    void play(int index) {
    }

    @Override
    void close() {
    }
}
