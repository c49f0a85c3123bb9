"""torch.compile through gemmtune: an Inductor pass that sends a compiled graph's GEMMs to the
gemmtune ops.

    gemmtune.install_inductor_pass()     # once, before torch.compile compiles
    model = torch.compile(model)

After AOT autograd (forward and backward graphs alike), `InductorPass` rewrites the graph's
`aten.mm`, `aten.bmm` and `aten.addmm` on CUDA bf16/fp16 tensors into `gemmtune::mm` (addmm:
with its bias where that is a contiguous vector of the output's type, which our kernel adds in
its epilogue, as a linear layer's is; any other bias is added after `gemmtune::mm`, an add
Inductor fuses with what follows), `aten._int_mm`
on CUDA int8 into `gemmtune::int_mm`, and `aten._scaled_mm` on CUDA fp8 into
`gemmtune::scaled_mm`. Inductor calls the ops as opaque kernels; at run time they are
`tuned_gemm`, `int_mm` and `scaled_mm`, whose plans are made and cached per shape, and which
hand what our kernels do not serve (a layout, an alignment) to torch; a `_scaled_mm`'s bias
is added by our kernel. Scaled or weighted addmm (`alpha`, `beta` other than 1) and other
dtypes stay Inductor's.

A `b` that is a constant of the graph (a `get_attr`, seen through views: what
`torch._inductor.config.freezing` makes of an inference model's parameters, whose values the
user has promised not to change) is passed as `constant_b`, so its loads start while the
kernel ahead finishes (`tuned_gemm`).
"""

from __future__ import annotations

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from gemmtune.core.problem import FP8_DTYPES

aten = torch.ops.aten
#: input dtypes whose products the pass hands to `gemmtune::mm`
FLOAT_INPUTS = (torch.bfloat16, torch.float16)


def _fake(node: object) -> torch.Tensor | None:
    value = getattr(node, "meta", {}).get("val")
    return value if isinstance(value, torch.Tensor) else None


def _ours(a: object, b: object, dtypes: tuple[torch.dtype, ...], mixed: bool = False) -> bool:
    """Whether the product of the graph values `a` and `b` goes to a gemmtune op: CUDA tensors
    of one of `dtypes`, the same one unless `mixed`."""
    fa, fb = _fake(a), _fake(b)
    return (
        fa is not None
        and fb is not None
        and fa.is_cuda
        and fb.is_cuda
        and (mixed or fa.dtype == fb.dtype)
        and fa.dtype in dtypes
        and fb.dtype in dtypes
    )


#: ops that only view their first argument: a constant seen through them is still one
VIEWS = (
    aten.t.default,
    aten.permute.default,
    aten.transpose.int,
    aten.view.default,
    aten.reshape.default,
    aten.expand.default,
    aten.unsqueeze.default,
)


def constant_source(node: object) -> bool:
    """Whether graph value `node` is a graph constant (a `get_attr`), through views."""
    while getattr(node, "op", None) == "call_function" and node.target in VIEWS:
        node = node.args[0]
    return getattr(node, "op", None) == "get_attr"


def epilogue_bias(bias: object, addmm: object) -> bool:
    """Whether an addmm's `bias` is one our kernel adds in its epilogue: a contiguous vector,
    one element per output column, of the output's type, which is the inputs' (a linear
    layer's bias; a bias of a wider type widens addmm's output)."""
    fake, out, a = _fake(bias), _fake(addmm), _fake(addmm.args[1])
    return (
        fake is not None
        and out is not None
        and a is not None
        and fake.dim() == 1
        and fake.shape[0] == out.shape[-1]
        and fake.stride() == (1,)
        and fake.dtype == out.dtype == a.dtype
    )


def rewrite_gemms(graph: torch.fx.Graph) -> int:
    """Rewrite `graph`'s mm, bmm, addmm, _int_mm and _scaled_mm calls that gemmtune takes (see
    the module's docstring); the number rewritten."""
    import gemmtune.api.torch_ops  # noqa: F401  registers the gemmtune ops

    mm, int_mm = torch.ops.gemmtune.mm.default, torch.ops.gemmtune.int_mm.default
    scaled_mm = torch.ops.gemmtune.scaled_mm.default
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (aten.mm.default, aten.bmm.default):
            if _ours(*node.args[:2], FLOAT_INPUTS):
                node.target = mm
                if constant_source(node.args[1]):
                    node.args = (*node.args[:2], None, True)
                rewritten += 1
        elif node.target is aten._int_mm.default:
            if _ours(*node.args[:2], (torch.int8,)):
                node.target = int_mm
                if constant_source(node.args[1]):
                    node.args = (*node.args[:2], True)
                rewritten += 1
        elif node.target is aten._scaled_mm.default:
            # fp8 scaled products, A's and B's types apart (e4m3 with e5m2)
            if _ours(*node.args[:2], FP8_DTYPES, mixed=True):
                node.target = scaled_mm  # the same arguments: calls ours does not serve go on
                if constant_source(node.args[1]):
                    node.kwargs = {**node.kwargs, "constant_b": True}
                rewritten += 1
        elif node.target is aten.addmm.default:
            bias, a, b = node.args[:3]
            weighted = node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1
            if not weighted and _ours(a, b, FLOAT_INPUTS):
                if epilogue_bias(bias, node):
                    node.target = mm
                    node.args = (a, b, None, constant_source(b), bias)
                    node.kwargs = {}
                    rewritten += 1
                    continue
                with graph.inserting_before(node):
                    args = (a, b, None, True) if constant_source(b) else (a, b)
                    product = graph.call_function(mm, args)
                    total = graph.call_function(aten.add.Tensor, (product, bias))
                product.meta["val"] = node.meta["val"]  # (m, n) of the output dtype, contiguous
                total.meta["val"] = node.meta["val"]
                node.replace_all_uses_with(total)
                graph.erase_node(node)
                rewritten += 1
    return rewritten


class InductorPass(CustomGraphPass):
    """The post-grad pass (`torch._inductor.config.post_grad_custom_post_pass`): `rewrite_gemms`,
    after the pass that was installed before it, if any."""

    def __init__(self, previous: CustomGraphPass | None = None):
        self.previous = previous

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.previous is not None:
            self.previous(graph)
        rewrite_gemms(graph)

    def uuid(self) -> object:
        """Inductor's compile cache key: this file's hash (and the previous pass's)."""
        previous = self.previous.uuid() if self.previous is not None else None
        return (get_hash_for_files((__file__,)), previous)


def install_inductor_pass() -> InductorPass:
    """Make torch.compile send the GEMMs of the graphs it compiles from now on through gemmtune
    (a pass already installed keeps running, before ours). Installing twice changes nothing."""
    import torch._inductor.config as config

    current = config.post_grad_custom_post_pass
    if isinstance(current, InductorPass):
        return current
    config.post_grad_custom_post_pass = InductorPass(current)
    return config.post_grad_custom_post_pass
