"""The bench peer's pg_chameleon configuration: the example's settings a user starts from, the bench's servers."""

import yaml

from cdc_pipeline.testing.peer_chameleon import SOURCE_NAME, chameleon_config

# The parts of pg_chameleon 2.0.21's config-example.yml the bench touches or keeps.
EXAMPLE = yaml.safe_load("""
pid_dir: '~/.pg_chameleon/pid/'
log_dir: '~/.pg_chameleon/logs/'
log_dest: file
log_level: info
type_override:
  "tinyint(1)": {override_to: boolean, override_tables: ["*"]}
pg_conn: {host: "localhost", port: "5432", user: "usr_replica", password: "never_commit_password",
          database: "db_replica", charset: "utf8"}
sources:
  mysql:
    db_conn: {host: "localhost", port: "3306", user: "usr_replica", password: "never_commit_passwords",
              charset: 'utf8', connect_timeout: 10}
    schema_mappings: {delphis_mediterranea: loxodonta_africana}
    limit_tables: [delphis_mediterranea.foo]
    skip_tables: [delphis_mediterranea.bar]
    grant_select_to: [usr_readonly]
    my_server_id: 100
    replica_batch_size: 10000
    replay_max_rows: 10000
    copy_max_memory: "300M"
    copy_mode: 'file'
    out_dir: /tmp
    sleep_loop: 1
    type: mysql
    skip_events: {insert: [delphis_mediterranea.foo], delete: [delphis_mediterranea], update: null}
  pgsql: {db_conn: {host: "localhost"}, type: pgsql}
fillfactor:
  "30": {tables: ["foo.bar"]}
""")


def test_config_points_at_the_bench_servers_and_keeps_the_example_defaults():
    config = chameleon_config(EXAMPLE, {"host": "127.0.0.1", "port": 3307, "user": "bench", "password": "s"},
                              {"host": "127.0.0.1", "port": 5433, "user": "postgres", "password": "t",
                               "database": "bench_load_chameleon"}, "bench_load", ["items"])

    assert config["pg_conn"] == {"host": "127.0.0.1", "port": "5433", "user": "postgres", "password": "t",
                                 "database": "bench_load_chameleon", "charset": "utf8"}
    assert list(config["sources"]) == [SOURCE_NAME]
    source = config["sources"][SOURCE_NAME]
    assert source["db_conn"] == {"host": "127.0.0.1", "port": "3307", "user": "bench", "password": "s",
                                 "charset": "utf8", "connect_timeout": 10}
    assert source["schema_mappings"] == {"bench_load": "bench_load"}
    assert source["limit_tables"] == ["bench_load.items"]
    assert source["skip_tables"] == [] and source["grant_select_to"] == []
    assert source["skip_events"] == {"insert": [], "delete": [], "update": []}
    # The replication settings stay the example's; only the log goes to standard output (foreground commands).
    for key in ("replica_batch_size", "replay_max_rows", "copy_max_memory", "copy_mode", "sleep_loop", "type"):
        assert source[key] == EXAMPLE["sources"]["mysql"][key]
    assert config["log_dest"] == "stdout" and config["log_level"] == "info"
    assert config["type_override"] == EXAMPLE["type_override"]
    assert "fillfactor" not in config
    assert yaml.safe_load(yaml.safe_dump(config)) == config
