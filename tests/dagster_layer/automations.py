"""What the Dagster UI lists as an asset's automations, asked of Dagster's own view of the code location."""

from dagster import AssetKey, Definitions
from dagster._core.remote_representation.external import RemoteRepository
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._core.remote_representation.handle import RepositoryHandle


def automations(defs: Definitions, key: AssetKey) -> tuple[set[str], set[str]]:
    """The names of the sensors and schedules that target the asset `key` (its page's "Automations")."""
    repository = RemoteRepository(RepositorySnap.from_def(defs.get_repository_def()), RepositoryHandle.for_test(),
                                  auto_materialize_use_sensors=True)
    return ({sensor.name for sensor in repository.get_sensors_targeting(key)},
            {schedule.name for schedule in repository.get_schedules_targeting(key)})
