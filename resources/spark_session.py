"""The Spark session resource."""


from typing import Optional

from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import SparkSession

from cdc_pipeline.capture.spark import build_spark_session
from cdc_pipeline.config import load_config


class SparkSessionResource(ConfigurableResource):
    """The Spark session of a run: the cluster of the connectors file's `spark:` section (master and conf, the same
    the CLI's runs use), with the Debezium runner on the driver classpath.

    Only the file's path is resource config: the Spark settings are read from the file when the session starts, so
    credentials in them (`spark.authenticate.secret: ${VAR}`) stay out of Dagster, as the DSN and passwords do, and
    a runner or class archive built after the definitions loaded is used. The session lives as long as the process:
    Spark's driver classpath is fixed when its JVM starts, and runs in one process (tests, the CLI) reuse it.
    """

    config_path: Optional[str] = Field(default=None, description="Connectors file; default $CDC_PIPELINE_CONFIG.")

    def get_session(self) -> SparkSession:
        return build_spark_session(load_config(self.config_path).spark)
