"""A Machine deleted before the controllers ever looked at it is still replaced.

A MachineSet keeps its replica count: the Machine it loses is replaced whether or not anyone
saw it before it went. The twin's Machine remediation learned a Machine's node from its
previous pass, so a Machine created and deleted between two passes (a repair asked for right
after the stand was built, on a busy machine) left its node gone and nothing replacing it:
`wait-for-node-gpus` said "no node yet" for as long as it was asked (a test's 30 s, once,
under CI load).
"""

from __future__ import annotations

from twin.clock import ManualClock
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.runtime import Twin
from twin.testing import MACHINES, capi_machine


def test_a_machine_deleted_between_two_passes_is_replaced() -> None:
    clock = ManualClock()
    twin = Twin(profile="1.36", clock=clock)
    twin.seed(nodes=1, gpus_per_node=2)
    manager = ControllerManager(TwinOptions(provisioning_delay=10))
    manager.attach(twin)
    store = twin.store
    manager.settle()  # the controllers have looked once: no Machine yet
    node = twin.seed_info["nodes"][0]
    machine = capi_machine(store, node)
    store.delete(MACHINES, machine, "default")  # before any pass saw it
    manager.settle()
    clock.advance(11)  # past the provisioning delay
    manager.settle()
    names = [n["metadata"]["name"] for n in store.list("nodes").items]
    assert node not in names, names
    assert len(names) == 1, f"the pool did not replace {node}: {names}"
