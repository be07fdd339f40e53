//! Channel padding folded into the weights (issue 15, after extraction): a convolution whose
//! input has a channel count that is not a multiple of [`CHANNEL_MULTIPLE`], computed by another
//! convolution for it alone, gets that count rounded up at both ends: the producer gets zero
//! filters for the extra output channels (and zero biases), the consumer zero weights for the
//! extra input channels. The producer's kernel then stores the padded tensor itself, so the
//! lowering has nothing to pad per call (it would otherwise run a `pad_channels` kernel in
//! front of the consumer, `src/lower/ops/conv.rs`), and both convolutions meet the library
//! kernels' alignment (C and K multiples of 8 for 16-byte fp16 accesses): a producer with an odd
//! output count ran on the direct kernel instead of the tensor cores.
//!
//! Exact: each padded channel holds `act(0)` (no weights, no bias, no residual), finite for
//! every epilogue activation, and the consumer multiplies it by zero. Where it applies:
//! EfficientNet-B0's squeeze-and-excitation blocks compiled unfused (squeeze widths 4 to 28,
//! ten `pad_channels` and ten direct convolutions before). It is a graph pass rather than a
//! rewrite rule because it changes a value's shape, which an e-class (one type for all its
//! nodes) cannot express, and there is no choice to weigh: the extra channels cost a fraction
//! of what the pad pass and the direct kernel cost.
//!
//! Thin inputs (C ≤ 4) are padded too when a convolution produces them (EfficientNet-B0's
//! squeeze width 4: the producer, with K = 4, ran on the direct kernel); a thin stem reads a
//! graph input, which has no producer here, and keeps the lowering's im2col / 4-channel paths.
//! Not padded: grouped and depthwise convolutions (padding changes their groups), producers
//! that are not a group-1 NHWC convolution with constant weights, values with another reader or
//! that are graph outputs (they must keep their shape), and unknown channel counts.

use crate::ir::dim::Dim;
use crate::ir::ops::kernel::{Conv2d, Layout};
use crate::ir::{Graph, Tensor, ValueType};
use ndarray::{ArrayD, IxDyn};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The channel multiple the library kernels need (`Target::conv_channel_multiple`: 8 fp16
/// values per 16-byte access on every target the project has).
pub const CHANNEL_MULTIPLE: usize = 8;

/// Pads every eligible producer → consumer channel count (see the module docs). Returns how
/// many values were padded.
pub fn pad_channels_into_producers(g: &mut Graph) -> usize {
    let mut padded = 0;
    let mut names: BTreeSet<String> = g.values.iter().map(|v| v.name.clone()).collect();
    loop {
        let Some((prod, cons, c)) = find_candidate(g) else { return padded };
        let cp = c.div_ceil(CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE;
        let x = g.nodes[prod].outputs[0];
        // Producer: zero filters (axis 0 of KRSC) and zero biases for the new output channels.
        let w = g.nodes[prod].inputs[1].expect("candidate producers have weights");
        let new_w = padded_const(g, &mut names, w, 0, cp, "pad_out");
        g.nodes[prod].inputs[1] = Some(new_w);
        if let Some(b) = g.nodes[prod].inputs.get(2).copied().flatten() {
            let new_b = padded_const(g, &mut names, b, 0, cp, "pad_out");
            g.nodes[prod].inputs[2] = Some(new_b);
        }
        if let Some(ty) = g.values[x].ty.as_mut() {
            ty.shape[3] = Dim::known(cp as i64);
        }
        // Consumer: zero weights for the new input channels (axis 3 of KRSC).
        let w = g.nodes[cons].inputs[1].expect("candidate consumers have weights");
        let new_w = padded_const(g, &mut names, w, 3, cp, "pad_in");
        g.nodes[cons].inputs[1] = Some(new_w);
        padded += 1;
    }
}

/// A group-1 NHWC conv over `c` channels (not a multiple of [`CHANNEL_MULTIPLE`]) whose input is the only use
/// of a group-1 NHWC conv's output, both with constant weights (and the producer's bias constant
/// or absent, and no residual): `(producer, consumer, c)`.
fn find_candidate(g: &Graph) -> Option<(usize, usize, usize)> {
    let producers = g.producers();
    let consumers = g.consumers();
    let is_const = |v: Option<usize>| v.is_some_and(|v| g.values[v].konst.is_some());
    let nhwc_conv = |n: usize| {
        g.nodes[n].op.downcast_ref::<Conv2d>().filter(|c| c.layout == Layout::Nhwc && c.geom.group == 1).is_some()
    };
    for (cons, node) in g.nodes.iter().enumerate() {
        if !nhwc_conv(cons) || !is_const(node.inputs.get(1).copied().flatten()) {
            continue;
        }
        let Some(x) = node.inputs.first().copied().flatten() else { continue };
        let Some(c) = g.values[x].ty.as_ref().and_then(|t| t.shape.get(3)).and_then(|d| d.as_known()) else {
            continue;
        };
        let c = c as usize;
        if c % CHANNEL_MULTIPLE == 0 {
            continue;
        }
        // x feeds this conv only, as its input (not also its residual), and is no graph output.
        if consumers[x] != [cons] || node.inputs.iter().flatten().filter(|&&v| v == x).count() != 1 {
            continue;
        }
        if g.outputs.contains(&x) {
            continue;
        }
        let Some(prod) = producers[x] else { continue };
        let p = &g.nodes[prod];
        let bias = p.inputs.get(2).copied().flatten();
        let fits = nhwc_conv(prod)
            && p.outputs.len() == 1
            && is_const(p.inputs.get(1).copied().flatten())
            && (bias.is_none() || is_const(bias))
            && p.inputs.get(3).copied().flatten().is_none();
        if fits {
            return Some((prod, cons, c));
        }
    }
    None
}

/// A new constant value: constant `v` zero-padded along `axis` to `len`, named after it.
fn padded_const(g: &mut Graph, names: &mut BTreeSet<String>, v: usize, axis: usize, len: usize, what: &str) -> usize {
    let t = g.values[v].konst.clone().expect("padded values are constants");
    let padded = pad_axis(&t, axis, len);
    let base = format!("{}.{what}{len}", g.values[v].name);
    let mut name = base.clone();
    let mut k = 1;
    while !names.insert(name.clone()) {
        k += 1;
        name = format!("{base}_{k}");
    }
    let shape = padded.shape().iter().map(|&d| Dim::known(d as i64)).collect();
    let id = g.add_value(name, Some(ValueType::new(padded.dtype(), shape)));
    g.values[id].konst = Some(Arc::new(padded));
    id
}

/// `t` with zeros appended along `axis` up to `len` (in `t`'s dtype: zero is exact in any).
fn pad_axis(t: &Tensor, axis: usize, len: usize) -> Tensor {
    let src = t.to_f32();
    let mut shape = src.shape().to_vec();
    shape[axis] = len;
    let mut out = ArrayD::<f32>::zeros(IxDyn(&shape));
    out.slice_each_axis_mut(|ax| {
        if ax.axis.index() == axis {
            ndarray::Slice::from(0..src.shape()[axis])
        } else {
            ndarray::Slice::from(..)
        }
    })
    .assign(&src);
    Tensor::F32(out).cast(t.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_with_zeros_along_one_axis_in_the_tensors_dtype() {
        let t = Tensor::from_f32s(&[2, 1, 1, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let p = pad_axis(&t, 3, 8);
        assert_eq!(p.shape(), &[2, 1, 1, 8]);
        let v = p.to_f32().iter().copied().collect::<Vec<_>>();
        assert_eq!(&v[..8], &[1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(&v[8..], &[4.0, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let rows = pad_axis(&t.cast(crate::ir::DType::F16), 0, 4);
        assert_eq!((rows.shape(), rows.dtype()), (&[4usize, 1, 1, 3][..], crate::ir::DType::F16));
        assert_eq!(rows.to_f32().iter().skip(6).copied().collect::<Vec<_>>(), vec![0.0; 6]);
    }
}
