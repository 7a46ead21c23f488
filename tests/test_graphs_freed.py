"""A finished run's graphs are freed once the caller lets go of the run: the per-graph
analyses (effects, program order, placeholder spans) live on the graph itself, not in
module-level tables that keep every graph the app ever loaded alive."""

import copy
import gc
import weakref

from torch.fx import Graph

from optimus_lens.core import aliasing
from optimus_lens.core.memo import keep, kept
from optimus_lens.frontend.run import optimize


def test_a_finished_run_frees_its_graphs():
    run = optimize("sample:recsys_towers", verify="step")  # recorded, checked step by step
    graphs = [weakref.ref(run.engine.gm.graph), weakref.ref(run.captured.gm.graph)]
    del run
    gc.collect()
    assert [g() is None for g in graphs] == [True, True]


def test_state_kept_on_a_graph_is_not_read_by_a_shallow_copy():
    g = Graph()
    g.output(g.placeholder("x"))
    ge = aliasing.analysis(g)
    assert aliasing.analysis(g) is ge
    twin = copy.copy(g)  # shares the original's __dict__ entries
    assert kept(twin, "_optimus_effects") is None
    assert aliasing.analysis(twin) is not ge and aliasing.analysis(twin).graph is twin
    assert keep(g, "k", 1) == 1 and kept(g, "k") == 1 and kept(twin, "k") is None
