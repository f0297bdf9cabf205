"""One block of steps of ``LANES`` blend segments side by side, written as LLVM vector IR.

The segment kernel (``blend_kernels.blend_segments``) runs 24 segments of a blend at once,
each from its own start state; this is its inner loop. Segment k's counts are column k of
``count`` (datasets x LANES, float64), so one row holds dataset d's count in every segment
and the rule's float64 expression ``w_d * t - c_d`` is one vector multiply and subtract per
row: 8 segments per vector, ``VECTORS`` independent vectors, whose dependency chains the
CPU overlaps (one segment alone waits on its previous pick at every step).

Why IR rather than numba source: numba leaves a loop over the 24 segments scalar (the
arrays may alias, and its float ``max`` is not a select), several times slower than this
(measurements: ``docs/perf/dataprep-blend.md``). Only ``fmul``, ``fsub``, ``fcmp`` and
``select`` are used, without fast-math flags, so no multiply-add is fused and every error is
rounded as the C++ loop rounds it; on a CPU without 512-bit vectors LLVM splits the vectors,
which changes the speed, not a bit of the result.

Per step, three passes over the datasets, each exact:

1. the maximum error per segment (a select that keeps the larger);
2. the lowest dataset whose error equals it: datasets from last to first, the index replaced
   wherever equal (the C++ loop's tie rule);
3. the pick's count taken (written out) and incremented, a count that reaches its limit
   becoming +inf (a spent dataset's error is then -inf).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

VECTOR = 8  # float64 per vector: one AVX-512 register
VECTORS = 3  # independent vectors per step: enough to hide a step's latency (2 was slower)
LANES = VECTOR * VECTORS

_F64 = ir.DoubleType()
_I64 = ir.IntType(64)
_I32 = ir.IntType(32)
_VF64 = ir.VectorType(_F64, VECTOR)
_VI64 = ir.VectorType(_I64, VECTOR)


def _splat(builder, value, vector_type):
    """``value`` in every element of a vector."""
    one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value,
                                 ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vector_type, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, VECTOR), [0] * VECTOR))


@intrinsic
def segment_steps(typingctx, count, weight, limit, first_t, steps, picks, taken):
    """``steps`` steps of LANES segments: ``count`` (datasets, LANES) float64, updated;
    ``weight`` and ``limit`` (datasets,) float64; ``first_t`` (LANES,) float64, each
    segment's blend position at the block's first step; ``picks`` (>= steps, LANES) int64
    and ``taken`` (>= steps, LANES) float64 receive each step's pick and its count."""
    sig = types.void(count, weight, limit, first_t, steps, picks, taken)

    def codegen(context, builder, signature, args):
        arrays = [context.make_array(ty)(context, builder, value)
                  for ty, value in zip(signature.args, args, strict=True)
                  if isinstance(ty, types.Array)]
        count_ptr, weight_ptr, limit_ptr, t_ptr, picks_ptr, taken_ptr = (a.data for a in arrays)
        datasets = cgutils.unpack_tuple(builder, arrays[0].shape)[0]
        steps = args[4]
        row_length = ir.Constant(_I64, LANES)

        def vector_at(ptr, row, v, vector_type):
            """Pointer to vector v of row ``row`` of a (rows, LANES) array."""
            offset = builder.add(builder.mul(row, row_length), ir.Constant(_I64, VECTOR * v))
            return builder.bitcast(builder.gep(ptr, [offset]), vector_type.as_pointer())

        def scalar_splat(ptr, index):
            return _splat(builder, builder.load(builder.gep(ptr, [index])), _VF64)

        one = _splat(builder, ir.Constant(_F64, 1.0), _VF64)
        zero = _splat(builder, ir.Constant(_F64, 0.0), _VF64)
        inf = _splat(builder, ir.Constant(_F64, float("inf")), _VF64)
        minus_inf = _splat(builder, ir.Constant(_F64, float("-inf")), _VF64)
        vs = range(VECTORS)
        first_t = [builder.load(vector_at(t_ptr, ir.Constant(_I64, 0), v, _VF64), align=8)
                   for v in vs]
        # accumulators across the loops over datasets (promoted to registers by LLVM)
        top_slot = [cgutils.alloca_once(builder, _VF64) for _ in vs]
        pick_slot = [cgutils.alloca_once(builder, _VI64) for _ in vs]
        taken_slot = [cgutils.alloca_once(builder, _VF64) for _ in vs]

        def error(d, t, v):
            w = scalar_splat(weight_ptr, d)
            c = builder.load(vector_at(count_ptr, d, v, _VF64), align=8)
            return builder.fsub(builder.fmul(w, t), c)

        with cgutils.for_range(builder, steps) as step:
            offset = _splat(builder, builder.sitofp(step.index, _F64), _VF64)
            t = []  # max(position, 1): the C++ loop's quirk at position 0
            for v in vs:
                position = builder.fadd(first_t[v], offset)  # integers below 2**53: exact
                t.append(builder.select(builder.fcmp_ordered(">", position, one),
                                        position, one))
                builder.store(minus_inf, top_slot[v])
                builder.store(_splat(builder, ir.Constant(_I64, 0), _VI64), pick_slot[v])
                builder.store(zero, taken_slot[v])
            with cgutils.for_range(builder, datasets) as loop:
                for v in vs:
                    e, top = error(loop.index, t[v], v), builder.load(top_slot[v])
                    builder.store(builder.select(builder.fcmp_ordered(">", e, top), e, top),
                                  top_slot[v])
            top = [builder.load(top_slot[v]) for v in vs]
            with cgutils.for_range(builder, datasets) as loop:
                d = builder.sub(builder.sub(datasets, ir.Constant(_I64, 1)), loop.index)
                for v in vs:
                    equal = builder.fcmp_ordered("==", error(d, t[v], v), top[v])
                    builder.store(builder.select(equal, _splat(builder, d, _VI64),
                                                 builder.load(pick_slot[v])), pick_slot[v])
            pick = [builder.load(pick_slot[v]) for v in vs]
            with cgutils.for_range(builder, datasets) as loop:
                d = loop.index
                limit = scalar_splat(limit_ptr, d)
                for v in vs:
                    where = vector_at(count_ptr, d, v, _VF64)
                    c = builder.load(where, align=8)
                    hit = builder.icmp_signed("==", pick[v], _splat(builder, d, _VI64))
                    builder.store(builder.select(hit, c, builder.load(taken_slot[v])),
                                  taken_slot[v])
                    c = builder.fadd(c, builder.select(hit, one, zero))
                    c = builder.select(builder.fcmp_ordered(">=", c, limit), inf, c)
                    builder.store(c, where, align=8)
            for v in vs:
                builder.store(pick[v], vector_at(picks_ptr, step.index, v, _VI64), align=8)
                builder.store(builder.load(taken_slot[v]),
                              vector_at(taken_ptr, step.index, v, _VF64), align=8)
        return context.get_dummy_value()

    return sig, codegen
