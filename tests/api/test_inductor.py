"""The Inductor pass on the CPU: which GEMMs of a graph it hands to the gemmtune ops (on fake
CUDA tensors), that it keeps a pass installed before it, and that a model still compiles and
computes the same with it."""

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._subclasses.fake_tensor import FakeTensorMode

import gemmtune
from gemmtune.api.inductor import install_inductor_pass, rewrite_gemms

aten = torch.ops.aten


def graph_of(calls):
    """A graph of `calls`: (target, [input specs], kwargs) with inputs (shape, dtype, device)
    as placeholders carrying fake values, the way a post-grad graph carries them."""
    graph = torch.fx.Graph()
    mode = FakeTensorMode()
    outputs = []
    for i, (target, specs, kwargs) in enumerate(calls):
        args = []
        for j, (shape, dtype, device) in enumerate(specs):
            node = graph.placeholder(f"x{i}_{j}")
            with mode:
                node.meta["val"] = torch.empty(shape, dtype=dtype, device=device)
            args.append(node)
        node = graph.call_function(target, tuple(args), kwargs)
        with mode:
            node.meta["val"] = target(*(a.meta["val"] for a in args), **kwargs)
        outputs.append(node)
    graph.output(tuple(outputs))
    return graph


def targets(graph):
    return [n.target for n in graph.nodes if n.op == "call_function"]


def test_cuda_gemms_of_our_dtypes_go_to_the_gemmtune_ops():
    bf16, f32, i8 = torch.bfloat16, torch.float32, torch.int8
    graph = graph_of(
        [
            (aten.mm.default, [((8, 16), bf16, "cuda"), ((16, 4), bf16, "cuda")], {}),
            (aten.bmm.default, [((2, 8, 16), bf16, "cuda"), ((2, 16, 4), bf16, "cuda")], {}),
            (aten._int_mm.default, [((32, 16), i8, "cuda"), ((16, 8), i8, "cuda")], {}),
            (aten.mm.default, [((8, 16), f32, "cuda"), ((16, 4), f32, "cuda")], {}),  # fp32
            (aten.mm.default, [((8, 16), bf16, "cpu"), ((16, 4), bf16, "cpu")], {}),  # CPU
            (
                aten.addmm.default,
                [((4,), bf16, "cuda"), ((8, 16), bf16, "cuda"), ((16, 4), bf16, "cuda")],
                {"beta": 2},
            ),  # weighted
        ]
    )
    assert rewrite_gemms(graph) == 3
    mm, int_mm = torch.ops.gemmtune.mm.default, torch.ops.gemmtune.int_mm.default
    assert targets(graph) == [mm, mm, int_mm, aten.mm.default, aten.mm.default, aten.addmm.default]


def test_addmm_with_a_linear_layers_bias_becomes_our_product_with_the_bias():
    """A contiguous vector of the output's type goes to the op, whose kernel adds it."""
    bf16 = torch.bfloat16
    specs = [((4,), bf16, "cuda"), ((8, 16), bf16, "cuda"), ((16, 4), bf16, "cuda")]
    graph = graph_of([(aten.addmm.default, specs, {})])
    assert rewrite_gemms(graph) == 1
    assert targets(graph) == [torch.ops.gemmtune.mm.default]
    (product,) = (n for n in graph.nodes if n.op == "call_function")
    assert [getattr(x, "name", x) for x in product.args] == ["x0_1", "x0_2", None, False, "x0_0"]
    assert product.meta["val"].shape == (8, 4)
    graph.lint()


def test_addmm_with_any_other_bias_becomes_our_product_plus_the_bias():
    """A matrix, a row of another type: added after the op, an add Inductor fuses."""
    bf16 = torch.bfloat16
    for bias in (((8, 4), bf16, "cuda"), ((1, 4), bf16, "cuda"), ((4,), torch.float32, "cuda")):
        specs = [bias, ((8, 16), bf16, "cuda"), ((16, 4), bf16, "cuda")]
        graph = graph_of([(aten.addmm.default, specs, {})])
        assert rewrite_gemms(graph) == 1
        assert targets(graph) == [torch.ops.gemmtune.mm.default, aten.add.Tensor]
        add = next(n for n in graph.nodes if n.target is aten.add.Tensor)
        assert add.args[1].name == "x0_0" and add.meta["val"].shape == (8, 4)
        graph.lint()


def test_the_pass_runs_after_one_installed_before_and_installs_once(inductor_post_pass):
    seen = []

    class Earlier(CustomGraphPass):
        def __call__(self, graph):
            seen.append(graph)

        def uuid(self):
            return "earlier"

    config = inductor_post_pass
    config.post_grad_custom_post_pass = Earlier()
    ours = install_inductor_pass()
    assert install_inductor_pass() is ours and config.post_grad_custom_post_pass is ours
    graph = graph_of([])
    ours(graph)
    assert seen == [graph] and ours.uuid()[1] == "earlier"


def test_a_compiled_model_computes_the_same_with_the_pass(inductor_post_pass):
    gemmtune.install_inductor_pass()
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    x = torch.randn(4, 32)
    torch.testing.assert_close(torch.compile(model)(x), model(x))
    torch._dynamo.reset()


def test_cuda_scaled_mm_of_fp8_goes_to_the_gemmtune_op_with_its_arguments():
    graph = torch.fx.Graph()
    mode = FakeTensorMode()
    with mode:
        values = [
            torch.empty(32, 64, dtype=torch.float8_e4m3fn, device="cuda"),
            torch.empty(16, 64, dtype=torch.float8_e5m2, device="cuda").t(),  # column-major
            torch.empty((), device="cuda"),
            torch.empty((), device="cuda"),
        ]
    nodes = []
    for i, value in enumerate(values):
        node = graph.placeholder(f"x{i}")
        node.meta["val"] = value
        nodes.append(node)
    kwargs = {"out_dtype": torch.bfloat16, "use_fast_accum": True}
    call = graph.call_function(aten._scaled_mm.default, tuple(nodes), kwargs)
    with mode:
        call.meta["val"] = aten._scaled_mm.default(*values, **kwargs)
    graph.output((call,))
    assert rewrite_gemms(graph) == 1
    assert targets(graph) == [torch.ops.gemmtune.scaled_mm.default]
    assert call.kwargs == kwargs and call.args == tuple(nodes)


def test_a_constant_b_of_the_graph_is_passed_as_constant_b():
    """A weight frozen into the graph (a get_attr, here seen through its transpose) is a
    constant b; a placeholder (a parameter the caller may change) is not."""
    bf16, i8 = torch.bfloat16, torch.int8
    graph = torch.fx.Graph()
    owner = torch.nn.Module()
    mode = FakeTensorMode()

    def valued(node, value=None):
        """`node` carrying its fake value: given, or its call's on its arguments' values."""
        if value is None:
            with mode:
                value = node.target(*(a.meta["val"] for a in node.args))
        node.meta["val"] = value
        return node

    def fake(*shape, dtype=bf16):
        with mode:
            return torch.empty(*shape, dtype=dtype, device="cuda")

    def frozen(name, *shape, dtype=bf16):
        """A weight of the graph's module, and its transpose."""
        setattr(owner, name, torch.nn.Parameter(torch.empty(*shape, dtype=dtype), False))
        weight = valued(graph.get_attr(name), fake(*shape, dtype=dtype))
        return valued(graph.call_function(aten.t.default, (weight,)))

    x = valued(graph.placeholder("x"), fake(8, 16))
    given = valued(graph.placeholder("w"), fake(4, 16).t())
    bias = valued(graph.placeholder("bias"), fake(4))
    q = valued(graph.placeholder("q"), fake(32, 16, dtype=i8))
    transposed = frozen("frozen", 4, 16)
    calls = [
        valued(graph.call_function(aten.mm.default, (x, transposed))),
        valued(graph.call_function(aten.mm.default, (x, given))),
        valued(graph.call_function(aten.addmm.default, (bias, x, transposed))),
    ]
    integer = valued(
        graph.call_function(aten._int_mm.default, (q, frozen("frozen_q", 8, 16, dtype=i8)))
    )
    graph.output((*calls, integer))
    assert rewrite_gemms(graph) == 4
    mm = torch.ops.gemmtune.mm.default
    products = [n for n in graph.nodes if n.target is mm]
    assert [n.args[3:] for n in products] == [(True,), (), (True, bias)]
    assert integer.target is torch.ops.gemmtune.int_mm.default and integer.args[2:] == (True,)
    torch.fx.GraphModule(owner, graph).graph.lint()
