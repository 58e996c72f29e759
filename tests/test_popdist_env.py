"""The environment contract: render, parse back, reject what is malformed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from popdist import env
from popdist.env import CONTRACT_NAMES, InstanceEnv, target_options_for
from simipu.hardware import parent_device_id


def layout(total: int, ipus: int, instances: int, hosts: int, **extra: object) -> list[InstanceEnv]:
    """One InstanceEnv per instance, instances in contiguous blocks per host."""
    local = total // instances
    per_host = instances // hosts
    return [
        InstanceEnv(
            num_total_replicas=total,
            num_ipus_per_replica=ipus,
            num_local_replicas=local,
            replica_index_offset=i * local,
            local_instance_index=i % per_host,
            num_local_instances=per_host,
            node_device_id=parent_device_id(total * ipus),
            vipu_host="vipu.example",
            vipu_port=8090,
            vipu_partition="p",
            vipu_timeout=120,
            target_options=target_options_for(total * ipus, 1, local * ipus, True),
            **extra,  # type: ignore[arg-type]
        )
        for i in range(instances)
    ]


LAYOUTS = {
    "1 instance": dict(total=4, ipus=1, instances=1, hosts=1),
    "4x2 on 2 hosts": dict(total=8, ipus=1, instances=4, hosts=2),
    "8 replicas x 2 IPUs, 4 instances": dict(total=8, ipus=2, instances=4, hosts=1),
    "64 replicas on 4 hosts": dict(total=64, ipus=1, instances=16, hosts=4),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_render_then_parse_round_trips(name: str) -> None:
    for inst in layout(**LAYOUTS[name]):  # type: ignore[arg-type]
        rendered = inst.render()
        assert set(rendered) <= set(CONTRACT_NAMES)
        assert all(isinstance(v, str) for v in rendered.values())
        assert InstanceEnv.from_environ(rendered) == inst


def test_round_trip_with_every_optional_field() -> None:
    (inst,) = layout(4, 1, 1, 1, gcd_id=3, executable_cache_path="cache/rn50",
                     master_addr="10.0.0.1", master_port=29500,
                     rendezvous_addr="10.0.0.2", rendezvous_port=40000,
                     job_id="job-42", offline=True)
    rendered = inst.render()
    assert rendered[env.EXECUTABLE_CACHE_PATH] == "cache/rn50"
    assert rendered[env.MASTER_ADDR] == "10.0.0.1" and rendered[env.MASTER_PORT] == "29500"
    assert rendered[env.RENDEZVOUS_PORT] == "40000"
    assert rendered[env.OFFLINE] == "1" and rendered[env.JOB_ID] == "job-42"
    assert rendered[env.VIPU_GCD_ID] == "3"
    assert InstanceEnv.from_environ(rendered) == inst
    assert hash(InstanceEnv.from_environ(rendered)) == hash(inst)


def test_unset_optionals_are_not_rendered() -> None:
    (inst,) = layout(4, 1, 1, 1)
    rendered = inst.render()
    for name in (env.EXECUTABLE_CACHE_PATH, env.MASTER_ADDR, env.MASTER_PORT,
                 env.RENDEZVOUS_ADDR, env.RENDEZVOUS_PORT, env.IPUOF_LOG_LEVEL):
        assert name not in rendered
    assert rendered[env.OFFLINE] == "0"
    assert env.SOFT_DEFAULTS == {env.IPUOF_LOG_LEVEL: "WARN"}


def test_reference_64_replica_launch_renders_as_graphcore_logged() -> None:
    instances = layout(64, 1, 16, 4, executable_cache_path="cache/rn50")
    for i, inst in enumerate(instances):
        r = inst.render()
        assert r[env.TOTAL_REPLICAS] == "64"
        assert r[env.LOCAL_REPLICAS] == "4"
        assert r[env.UNIFORM_REPLICAS] == "1"
        assert r[env.REPLICA_INDEX_OFFSET] == str(4 * i)
        assert r[env.LOCAL_INSTANCE_INDEX] == str(i % 4)
        assert r[env.NODE_DEVICE_ID] == "126"
        assert r[env.TARGET_OPTIONS] == (
            '{"ipuLinkDomainSize":"64","ipuLinkConfiguration":"slidingWindow",'
            '"ipuLinkTopology":"torus","gatewayMode":"true","instanceSize":"4"}'
        )
        for rank in (env.OMPI_RANK, env.TORCH_RANK):
            assert r[rank] == str(i)
        for size in (env.OMPI_SIZE, env.TORCH_WORLD_SIZE):
            assert r[size] == "16"
        for local in (env.OMPI_LOCAL_RANK, env.OMPI_NODE_RANK, env.TORCH_LOCAL_RANK):
            assert r[local] == str(i % 4)
        for local_size in (env.OMPI_LOCAL_SIZE, env.TORCH_LOCAL_WORLD_SIZE):
            assert r[local_size] == "4"


def test_instance_index_and_count_follow_graphcore_rule() -> None:
    instances = layout(8, 2, 4, 1)
    assert [x.instance_index for x in instances] == [0, 1, 2, 3]
    assert {x.num_instances for x in instances} == {4}
    assert [x.device_id for x in instances] == [24, 25, 26, 27]
    assert [x.replica_index_offset for x in instances] == [0, 2, 4, 6]


def test_not_under_poprun_gives_none() -> None:
    assert InstanceEnv.from_environ({}) is None
    assert InstanceEnv.from_environ({"RANK": "3", "PATH": "/bin"}) is None


def test_partial_environment_takes_popdist_defaults() -> None:
    parsed = InstanceEnv.from_environ({env.TOTAL_REPLICAS: "4"})
    assert parsed is not None
    assert (parsed.num_ipus_per_replica, parsed.num_local_replicas, parsed.replica_index_offset) == (1, 1, 0)
    assert (parsed.instance_index, parsed.num_instances, parsed.node_device_id) == (0, 4, 6)
    assert parsed.target_options == ()


@pytest.mark.parametrize(
    ("variable", "value"),
    [(env.TOTAL_REPLICAS, "abc"), (env.TOTAL_REPLICAS, ""), (env.LOCAL_REPLICAS, "2.0"),
     (env.IPUS_PER_REPLICA, "0x2"), (env.VIPU_PORT, "eighty"), (env.MASTER_PORT, "1e3"),
     (env.LOCAL_INSTANCE_INDEX, "one")],
)
def test_malformed_integer_names_the_variable(variable: str, value: str) -> None:
    rendered = layout(8, 1, 4, 2)[1].render()
    rendered[variable] = value
    with pytest.raises(ValueError) as info:
        InstanceEnv.from_environ(rendered)
    assert variable in str(info.value) and repr(value) in str(info.value)
    assert info.value.variable == variable  # type: ignore[attr-defined]


def test_exact_message_for_a_non_integer() -> None:
    with pytest.raises(ValueError, match=r"^POPDIST_NUM_TOTAL_REPLICAS='abc' is not an integer$"):
        InstanceEnv.from_environ({env.TOTAL_REPLICAS: "abc"})


@pytest.mark.parametrize(
    ("variable", "value"),
    [(env.TOTAL_REPLICAS, "0"), (env.LOCAL_REPLICAS, "3"), (env.REPLICA_INDEX_OFFSET, "3"),
     (env.REPLICA_INDEX_OFFSET, "8"), (env.LOCAL_INSTANCE_INDEX, "2"), (env.VIPU_PORT, "0"),
     (env.MASTER_PORT, "70000"), (env.NODE_DEVICE_ID, "-1"), (env.OFFLINE, "yes"),
     (env.UNIFORM_REPLICAS, "0"), (env.UNIFORM_REPLICAS, "2"),
     (env.TARGET_OPTIONS, "{not json"), (env.TARGET_OPTIONS, '{"instanceSize":4}'),
     (env.TARGET_OPTIONS, '["a"]')],
)
def test_inconsistent_value_names_the_variable(variable: str, value: str) -> None:
    rendered = layout(8, 1, 4, 2, master_port=29500)[1].render()
    rendered[variable] = value
    with pytest.raises(ValueError, match=variable):
        InstanceEnv.from_environ(rendered)


def test_values_with_surrounding_whitespace_are_accepted() -> None:
    rendered = layout(8, 1, 4, 2)[3].render()
    rendered[env.TOTAL_REPLICAS] = " 8\n"
    assert InstanceEnv.from_environ(rendered) == layout(8, 1, 4, 2)[3]


BASE = dict(num_total_replicas=8, num_ipus_per_replica=1, num_local_replicas=2,
            replica_index_offset=2, local_instance_index=1, num_local_instances=2,
            node_device_id=14, vipu_host="h", vipu_port=8090, vipu_partition="p",
            vipu_timeout=10)


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_total_replicas", 0), ("num_ipus_per_replica", 0), ("num_local_replicas", 3),
     ("num_local_replicas", 0), ("replica_index_offset", 1), ("replica_index_offset", 8),
     ("replica_index_offset", -2), ("local_instance_index", 2), ("num_local_instances", 5),
     ("num_local_instances", 0), ("vipu_port", 65536), ("vipu_timeout", -1),
     ("master_port", -1), ("gcd_id", -1), ("num_total_replicas", True), ("vipu_host", 5),
     ("offline", 1), ("executable_cache_path", ""), ("target_options", (("a", 1),)),
     ("job_id", "a\0b")],
)
def test_validation_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        InstanceEnv(**{**BASE, field: value})  # type: ignore[arg-type]


def test_record_is_frozen_and_target_options_mapping_is_converted() -> None:
    inst = InstanceEnv(**BASE, target_options={"b": "1", "a": "2"})  # type: ignore[arg-type]
    assert inst.target_options == (("b", "1"), ("a", "2"))
    assert json.loads(inst.render()[env.TARGET_OPTIONS]) == {"b": "1", "a": "2"}
    assert inst.render()[env.TARGET_OPTIONS] == '{"b":"1","a":"2"}'
    with pytest.raises(dataclasses.FrozenInstanceError):
        inst.num_total_replicas = 4  # type: ignore[misc]
    hash(inst)


def test_target_options_for() -> None:
    assert target_options_for(128, 2, 8, False) == {
        "ipuLinkDomainSize": "64", "ipuLinkConfiguration": "slidingWindow",
        "ipuLinkTopology": "torus", "gatewayMode": "false", "instanceSize": "8",
    }
    assert list(target_options_for(4, 1, 4, True)) == [
        "ipuLinkDomainSize", "ipuLinkConfiguration", "ipuLinkTopology", "gatewayMode", "instanceSize"]


@pytest.mark.parametrize("args", [(0, 1, 1), (64, 0, 4), (64, 3, 4), (64, 1, 3), (64, 1, 0)])
def test_target_options_for_rejects_bad_splits(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        target_options_for(*args, True)


def test_contract_names_are_unique_and_cover_render() -> None:
    assert len(CONTRACT_NAMES) == len(set(CONTRACT_NAMES))
    (inst,) = layout(4, 1, 1, 1, master_port=1, rendezvous_port=2, executable_cache_path="c", host_label="node1",
                     device_fds=(3, 4), job_id="j",
                     fabric=env.FabricSettings(token="ab" * 16, transport="tcp", timeout=3, startup_timeout=7))
    # the user's choice (a soft default), a fact about poprun's console rather than the instance, and the
    # --compat-imports choice (the plan adds it: it is about the instance's Python, not its place in the job)
    assert set(CONTRACT_NAMES) - set(inst.render()) == {env.IPUOF_LOG_LEVEL, env.CONSOLE_IS_TERMINAL,
                                                        env.COMPAT_IMPORTS}
    assert env.InstanceEnv.from_environ(inst.render()).fabric == inst.fabric
    assert "ab" * 16 not in repr(inst)  # the job token never reaches a log through repr


def test_the_split_modules_leave_popdist_env_the_place_to_import_from() -> None:
    """env.py became three modules (the record, reading the variables, checking a record): nothing moved away."""
    names = ("InstanceEnv", "FabricSettings", "EnvContractError", "target_options_for", "read_int",
             "is_uniform_replicas", "FABRIC_TRANSPORTS", "MAX_TIMEOUT_SECONDS", "DEFAULT_VIPU_HOST",
             "DEFAULT_VIPU_PORT", "DEFAULT_VIPU_TIMEOUT", "CONTRACT_NAMES", "SOFT_DEFAULTS", "TOTAL_REPLICAS")
    assert [name for name in names if not hasattr(env, name)] == []
    with pytest.raises(env.EnvContractError, match="POPRUN_FABRIC_TIMEOUT"):
        env.InstanceEnv.from_environ({env.TOTAL_REPLICAS: "1", env.FABRIC_TIMEOUT: "soon"})
