"""The Spark session resource."""


from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import SparkSession

from cdc_pipeline.capture.spark import build_spark_session, default_master


class SparkSessionResource(ConfigurableResource):
    """The Spark session of a run, with the Debezium runner on the driver classpath (local[*] unless configured).

    The session lives as long as the process: Spark's driver classpath is fixed when its JVM starts, and runs
    in one process (tests, the CLI) reuse it.
    """

    master: str = Field(default_factory=default_master,
                        description="Any Spark master URL: local[*], spark://host:7077, yarn, ... (default: "
                                    "$CDC_SPARK_MASTER, else local[*]).")
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark configuration.")

    def get_session(self) -> SparkSession:
        return build_spark_session(self.master, self.conf)
