"""`RunQueueWait`, a lingering run's `linger_yields`: true only while a run of its priority or higher waits in the queue
for its slot (a queued run of its own connector, or any queued run while the runs in progress fill
`max_concurrent_runs`); verify runs are queued below sync runs."""

from dagster import DagsterEvent, DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, instance_for_test
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from resources import debezium_runner
from assets.verify_checks import VERIFY_PRIORITY
from resources.debezium_runner import CONNECTOR_TAG, ENGINE_OWN, ENGINE_SERVED, ENGINE_TAG, RunQueueWait


def _add_run(instance, connector: str, status: DagsterRunStatus, engine: str | None = None,
             priority: int | None = None) -> None:
    # A queued run carries where the daemon launches it from.
    origin = RemoteJobOrigin(repository_origin=RemoteRepositoryOrigin(
        code_location_origin=InProcessCodeLocationOrigin(loadable_target_origin=LoadableTargetOrigin(
            python_file=__file__)), repository_name="__repository__"), job_name=f"sync_{connector}")
    run = instance.add_run(DagsterRun(job_name=f"sync_{connector}", status=DagsterRunStatus.NOT_STARTED,
                                      tags={CONNECTOR_TAG: connector, **({ENGINE_TAG: engine} if engine else {}),
                                            **({debezium_runner.PRIORITY_TAG: str(priority)} if priority is not None
                                               else {})},
                                      remote_job_origin=origin))
    event = {DagsterRunStatus.QUEUED: DagsterEventType.RUN_ENQUEUED,
             DagsterRunStatus.STARTED: DagsterEventType.RUN_START}[status]
    instance.run_storage.handle_run_event(run.run_id, DagsterEvent(event.value, run.job_name))


def test_linger_yields_only_to_runs_queued_for_its_slot(monkeypatch):
    monkeypatch.setattr(debezium_runner, "QUEUE_CHECK_SECONDS", 0.0)
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 2}}) as instance:
        _add_run(instance, "alpha", DagsterRunStatus.STARTED)
        waits = RunQueueWait(instance, "alpha")
        assert not waits()
        # A slot is free: the queued run of another connector starts without this one ending.
        _add_run(instance, "beta", DagsterRunStatus.QUEUED)
        assert not waits()
        _add_run(instance, "gamma", DagsterRunStatus.STARTED)
        assert waits()
        # One queued run lacks one slot: the longest running yields, not every run that lingers.
        assert not RunQueueWait(instance, "gamma")()


def test_as_many_runs_yield_as_the_queued_runs_lack_slots_the_longest_running_first(monkeypatch):
    monkeypatch.setattr(debezium_runner, "QUEUE_CHECK_SECONDS", 0.0)
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 3}}) as instance:
        for connector in ("alpha", "beta", "gamma"):
            _add_run(instance, connector, DagsterRunStatus.STARTED)
        _add_run(instance, "delta", DagsterRunStatus.QUEUED)
        _add_run(instance, "epsilon", DagsterRunStatus.QUEUED)
        assert [RunQueueWait(instance, name)() for name in ("alpha", "beta", "gamma")] == [True, True, False]


def test_linger_yields_to_a_queued_run_of_its_own_connector(monkeypatch):
    monkeypatch.setattr(debezium_runner, "QUEUE_CHECK_SECONDS", 0.0)
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 10}}) as instance:
        _add_run(instance, "alpha", DagsterRunStatus.STARTED)
        _add_run(instance, "alpha", DagsterRunStatus.QUEUED)
        assert RunQueueWait(instance, "alpha")()
        assert not RunQueueWait(instance, "beta")()


def test_the_queue_is_asked_at_most_once_per_interval():
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 1}}) as instance:
        _add_run(instance, "alpha", DagsterRunStatus.STARTED)
        waits = RunQueueWait(instance, "alpha")
        assert not waits()
        _add_run(instance, "beta", DagsterRunStatus.QUEUED)
        assert not waits()  # the answer of less than QUEUE_CHECK_SECONDS ago


def test_an_instance_without_a_run_queue_yields_only_to_its_own_connector(monkeypatch):
    monkeypatch.setattr(debezium_runner, "QUEUE_CHECK_SECONDS", 0.0)
    instance = DagsterInstance.ephemeral()  # what execute_in_process runs on
    _add_run(instance, "alpha", DagsterRunStatus.STARTED)
    _add_run(instance, "beta", DagsterRunStatus.QUEUED)
    assert not RunQueueWait(instance, "alpha")()
    assert RunQueueWait(instance, "beta")()


# The project's dagster.yaml: runs with a driver JVM of their own limited apart from all runs.
ENGINE_LIMITS = {"max_concurrent_runs": 12, "tag_concurrency_limits": [
    {"key": CONNECTOR_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
    {"key": ENGINE_TAG, "value": ENGINE_OWN, "limit": 2}]}


def test_a_run_with_its_own_jvm_yields_to_one_queued_for_the_jvms_limit_and_a_served_run_does_not(monkeypatch):
    monkeypatch.setattr(debezium_runner, "QUEUE_CHECK_SECONDS", 0.0)
    with instance_for_test(overrides={"run_queue": ENGINE_LIMITS}) as instance:
        _add_run(instance, "alpha", DagsterRunStatus.STARTED, ENGINE_OWN)
        _add_run(instance, "beta", DagsterRunStatus.STARTED, ENGINE_SERVED)
        own = RunQueueWait(instance, "alpha", {CONNECTOR_TAG: "alpha", ENGINE_TAG: ENGINE_OWN})
        served = RunQueueWait(instance, "beta", {CONNECTOR_TAG: "beta", ENGINE_TAG: ENGINE_SERVED})
        # A served run queued: 10 slots are free for it, nobody yields.
        _add_run(instance, "gamma", DagsterRunStatus.QUEUED, ENGINE_SERVED)
        assert not own() and not served()
        # A run with its own JVM queued while one JVM's slot of two is free: it starts.
        _add_run(instance, "delta", DagsterRunStatus.QUEUED, ENGINE_OWN)
        assert not own() and not served()
        # Both JVM slots held: the queued run waits for the lingering run with a JVM, not for the served one.
        _add_run(instance, "epsilon", DagsterRunStatus.STARTED, ENGINE_OWN)
        assert own() and not served()
        # A run without the tag (verify, cdc_control) counts only against all runs.
        assert not RunQueueWait(instance, "zeta", {CONNECTOR_TAG: "zeta"})()


def test_a_sync_run_does_not_yield_to_a_queued_run_of_lower_priority(monkeypatch):
    monkeypatch.setattr(debezium_runner, "QUEUE_CHECK_SECONDS", 0.0)
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 1}}) as instance:
        _add_run(instance, "alpha", DagsterRunStatus.STARTED)
        waits = RunQueueWait(instance, "alpha", {CONNECTOR_TAG: "alpha"})
        # A verify run (priority -1) waits for the full queue: the lingering sync run keeps its slot.
        _add_run(instance, "beta", DagsterRunStatus.QUEUED, priority=VERIFY_PRIORITY)
        assert not waits()
        # Also one of its own connector's.
        _add_run(instance, "alpha", DagsterRunStatus.QUEUED, priority=VERIFY_PRIORITY)
        assert not waits()
        # A sync run (priority 0) queued: it yields.
        _add_run(instance, "gamma", DagsterRunStatus.QUEUED)
        assert waits()
        # A run of a higher priority does not yield to it.
        assert not RunQueueWait(instance, "alpha", {CONNECTOR_TAG: "alpha", debezium_runner.PRIORITY_TAG: "5"})()


def test_the_verify_jobs_are_below_the_sync_runs_in_the_queue(tmp_path):
    from assets.sync_job import build_sync_job
    from assets.verify_checks import build_verify_checks
    from cdc_pipeline.config import parse_config
    from cdc_pipeline.ops.tables import ReplicatedTable

    connector = parse_config({
        "destination": {"dsn": "postgresql://cdc@127.0.0.1:9/warehouse"},
        "connectors": {"alpha": {"type": "mariadb", "hostname": "127.0.0.1", "user": "cdc", "password": "x",
                                 "database": "inventory"}}}, tmp_path / "connectors.yaml").connector("alpha")

    verify = build_verify_checks(connector, [ReplicatedTable("inventory.items", "inventory", "items")],
                                 str(tmp_path / "connectors.yaml"))
    sync = build_sync_job(connector, [])

    assert debezium_runner.run_priority(verify.job.tags) == VERIFY_PRIORITY < debezium_runner.run_priority(sync.tags)


def test_a_run_queued_behind_its_own_connectors_run_makes_no_other_run_yield(monkeypatch):
    monkeypatch.setattr(debezium_runner, "QUEUE_CHECK_SECONDS", 0.0)
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 2}}) as instance:
        _add_run(instance, "alpha", DagsterRunStatus.STARTED)
        _add_run(instance, "beta", DagsterRunStatus.STARTED)
        _add_run(instance, "beta", DagsterRunStatus.QUEUED)
        assert not RunQueueWait(instance, "alpha")()
        assert RunQueueWait(instance, "beta")()


def test_every_lingering_run_yields_once_a_queued_run_has_waited_long(monkeypatch):
    monkeypatch.setattr(debezium_runner, "QUEUE_CHECK_SECONDS", 0.0)
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 2}}) as instance:
        _add_run(instance, "alpha", DagsterRunStatus.STARTED)
        _add_run(instance, "beta", DagsterRunStatus.STARTED)
        _add_run(instance, "gamma", DagsterRunStatus.QUEUED)
        assert not RunQueueWait(instance, "beta")()  # alpha, the longest running, makes the room
        # The longest running one may be busy streaming: after a while the others yield too.
        monkeypatch.setattr(debezium_runner, "YIELD_ALL_AFTER_SECONDS", 0.0)
        assert RunQueueWait(instance, "beta")()
