"""Fixtures shared by the torch and CUDA tests (absent torch, none of them is used)."""

import pytest


@pytest.fixture
def grouped_graphs(monkeypatch):
    """The groups that hypercodec's inductor pass (`hnn._group_stored_linears`) makes in each
    graph compiled during the test, one entry a graph; inductor's FX graph cache is off (a
    cached graph skips the pass), and grouping is on again afterwards."""
    torch = pytest.importorskip("torch")
    import hypercodec.nn as hnn
    from torch._inductor import config

    made = []
    real = hnn._group_stored_linears

    def spy(graph):
        made.append(real(graph))
        return made[-1]

    monkeypatch.setattr(hnn, "_group_stored_linears", spy)
    try:
        with config.patch(fx_graph_cache=False):
            yield made
    finally:
        hnn.set_compile_grouping(True)
        torch._dynamo.reset()


@pytest.fixture
def projections():
    """A decoder block's projections of width `d`: q, k and v of one normed input; gate and up
    of another (what the grouping pass groups)."""
    torch = pytest.importorskip("torch")

    class Projections(torch.nn.Module):
        def __init__(self, d: int, bias: bool = True) -> None:
            super().__init__()
            L = torch.nn.Linear
            self.d = d
            self.q, self.k, self.v = L(d, d, bias=bias), L(d, d // 2, bias=False), L(d, d // 2, bias=bias)
            self.o = L(2 * d, d, bias=bias)
            self.gate, self.up, self.down = L(d, 3 * d // 2, bias=bias), L(d, 3 * d // 2, bias=False), L(3 * d // 2, d)

        def forward(self, x):
            h = torch.nn.functional.layer_norm(x, (self.d,))
            a = self.o(torch.cat([self.q(h), self.k(h), self.v(h)], -1)) + x
            h = torch.nn.functional.layer_norm(a, (self.d,))
            return self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h)) + a

    return Projections
