"""Where handlers run: the thread path or a Ray task, its options, feasibility, errors
(rayq.core.control.ray_tasks; no Ray)."""

import asyncio

import pytest

from rayq.core.codec.tasks import TaskSpec
from rayq.core.consumers.decisions import Unloadable, refreshed_handlers
from rayq.core.control.ray_tasks import (DEFAULT_NUM_CPUS, NodeShapes, call_to_end, fits_a_node,
                                         handler_error, live_node_resources, ray_options,
                                         resource_demand, runs_as_ray_task)
from rayq.errors import RuntimeFailure


def spec(**options):
    return TaskSpec("t", "tasks", **options)


@pytest.mark.parametrize("options, on_ray", [
    (dict(), False), (dict(concurrency=2, max_receives=3), False),
    (dict(num_cpus=0), True), (dict(num_gpus=1), True), (dict(memory=0), True),
    (dict(resources={}), True), (dict(runtime_env={"env_vars": {"A": "b"}}), True)])
def test_a_type_runs_as_a_ray_task_when_it_sets_any_ray_option(options, on_ray):
    assert runs_as_ray_task(spec(**options)) is on_ray
    assert (ray_options(spec(**options)) is not None) is on_ray


@pytest.mark.parametrize("options, expected", [
    (dict(runtime_env={"env_vars": {"A": "b"}}),
     dict(num_cpus=DEFAULT_NUM_CPUS, runtime_env={"env_vars": {"A": "b"}})),
    (dict(num_cpus=0.5, num_gpus=1, memory=2 << 30, resources={"special": 1}),
     dict(num_cpus=0.5, num_gpus=1, memory=2 << 30, resources={"special": 1.0})),
    (dict(num_cpus=0, runtime_env={"working_dir": "/srv/job"}),
     dict(num_cpus=0, runtime_env={"working_dir": "local:///srv/job"})),
    (dict(runtime_env={"working_dir": "gcs://_ray_pkg_abc.zip"}),
     dict(num_cpus=DEFAULT_NUM_CPUS, runtime_env={"working_dir": "gcs://_ray_pkg_abc.zip"})),
])
def test_the_ray_options_are_the_types_with_one_cpu_by_default_and_no_ray_retries(options,
                                                                                expected):
    assert ray_options(spec(**options)) == {**expected, "max_retries": 0, "name": "rayq:t"}


def test_the_options_leave_the_specs_runtime_env_as_it_is():
    s = spec(runtime_env={"working_dir": "/srv/job"})
    ray_options(s)
    assert s.runtime_env == {"working_dir": "/srv/job"}


@pytest.mark.parametrize("options, demand", [
    (dict(num_cpus=1.0), {"CPU": 1.0}),
    (dict(num_cpus=0, num_gpus=0.5, memory=1000, resources={"special": 1.0, "none": 0.0}),
     {"GPU": 0.5, "memory": 1000.0, "special": 1.0}),
])
def test_the_demand_names_ray_resources_and_leaves_out_zero_amounts(options, demand):
    assert resource_demand(options) == demand


@pytest.mark.parametrize("demand, nodes, fits", [
    ({}, [], False),                                   # no live node at all
    ({}, [{"CPU": 0.0}], True),
    ({"CPU": 1.0}, [{"CPU": 2.0}], True),
    ({"CPU": 1.0, "special": 1.0}, [{"CPU": 2.0}, {"CPU": 1.0, "special": 1.0}], True),
    ({"CPU": 2.0, "special": 1.0}, [{"CPU": 2.0}, {"CPU": 1.0, "special": 1.0}], False),
    ({"GPU": 1.0}, [{"CPU": 8.0}], False),
])
def test_a_demand_fits_when_one_node_has_all_of_it(demand, nodes, fits):
    assert fits_a_node(demand, nodes) is fits


def test_only_live_nodes_count():
    nodes = [{"Alive": True, "Resources": {"CPU": 2.0}}, {"Alive": False, "Resources": {"GPU": 1}},
             {"Alive": True}]
    assert live_node_resources(nodes) == [{"CPU": 2.0}, {}]


def test_node_shapes_are_read_again_only_once_stale_and_refuse_what_fits_no_node():
    shapes, reads = NodeShapes(ttl_s=5.0), []

    async def read():
        reads.append(1)
        return [{"CPU": 2.0}]

    asyncio.run(shapes.refresh(100.0, read))
    asyncio.run(shapes.refresh(104.9, read))
    assert len(reads) == 1
    asyncio.run(shapes.refresh(105.0, read))
    assert len(reads) == 2
    shapes.check("t", {"CPU": 2.0})
    with pytest.raises(RuntimeFailure, match="no live node .* task type 't'.*'GPU': 1.0"):
        shapes.check("t", {"GPU": 1.0})


class WrappedError(Exception):
    """Like Ray's RayTaskError: the handler's exception as ``cause``."""

    def __init__(self, cause):
        super().__init__("wrapped")
        self.cause = cause


def test_the_handlers_own_error_is_given_back_from_the_ray_tasks_error():
    inner = ValueError("bad input")
    assert handler_error(WrappedError(inner)) is inner
    plain = WrappedError(None)
    assert handler_error(plain) is plain
    crashed = RuntimeError("worker died")
    assert handler_error(crashed) is crashed


def test_a_ray_task_runs_plain_and_coroutine_handlers_to_their_end():
    async def later(x, y=0):
        await asyncio.sleep(0)
        return x + y

    assert call_to_end(lambda x, y=0: x * y, [3], {"y": 2}) == 6
    assert call_to_end(later, [3], {"y": 2}) == 5


def test_types_with_ray_options_are_launched_others_loaded_each_once_per_version():
    loads, launches = [], []

    def load(blob):
        loads.append(blob)
        return f"fn<{blob.decode()}>"

    def launch(s, blob, options):
        launches.append((s.type, blob, options["num_cpus"]))
        return f"ray<{blob.decode()}>"

    plain, gpu = TaskSpec("plain", "tasks"), TaskSpec("gpu", "tasks", num_gpus=1)
    table = {"plain": (plain, b"p1"), "gpu": (gpu, b"g1")}
    got = refreshed_handlers({}, table, load, launch)
    assert got == {"plain": (plain, "fn<p1>", b"p1"), "gpu": (gpu, "ray<g1>", b"g1")}
    assert refreshed_handlers(got, table, load, launch) == got
    assert loads == [b"p1"] and launches == [("gpu", b"g1", DEFAULT_NUM_CPUS)]
    table["gpu"] = (gpu, b"g2")  # a new handler version: a new remote function
    assert refreshed_handlers(got, table, load, launch)["gpu"][1] == "ray<g2>"


def test_a_type_whose_ray_task_cannot_be_made_is_disabled_alone():
    def launch(s, blob, options):
        raise ValueError("bad runtime_env")

    table = {"plain": (TaskSpec("plain", "tasks"), b"p"),
             "env": (TaskSpec("env", "tasks", runtime_env={"x": 1}), b"e")}
    got = refreshed_handlers({}, table, lambda blob: "fn", launch)
    assert got["env"][1] == Unloadable("ValueError", "bad runtime_env")
    assert got["plain"][1] == "fn"
