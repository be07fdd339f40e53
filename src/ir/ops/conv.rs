//! The conv op family: Conv and ConvTranspose (1-D, 2-D and 3-D spatial), plus the sliding
//! window geometry (`Window`: kernel, strides, dilations, pads, auto_pad, ceil_mode) that the
//! pooling ops share.

use super::linalg::{f32_of, into_dtype};
use super::OpSpec;
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, Dim, Fact, NodeCtx, Op, OpError, OpResult, Tensor};
use crate::reference::conv as kernels;
use crate::reference::linalg::{contiguous, standard};
use crate::{op_bail, op_ensure};
use ndarray::{ArrayD, IxDyn};
use std::any::Any;

/// Concrete geometry of a sliding window over 3 spatial dims (lifted from 1-D/2-D).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geom3 {
    pub input: [usize; 3],
    pub kernel: [usize; 3],
    pub strides: [usize; 3],
    pub dilations: [usize; 3],
    pub pad_begin: [usize; 3],
    pub pad_end: [usize; 3],
    pub output: [usize; 3],
}

fn lift(v: &[usize], fill: usize) -> OpResult<[usize; 3]> {
    if v.len() > 3 {
        return Err(OpError(format!("at most 3 spatial dims are supported, got {}", v.len())));
    }
    let mut out = [fill; 3];
    out[3 - v.len()..].copy_from_slice(v);
    Ok(out)
}

impl Geom3 {
    /// Lifts per-axis spatial parameters (all of the same length, 1 to 3) to 3-D.
    pub fn lift(
        input: &[usize],
        kernel: &[usize],
        strides: &[usize],
        dilations: &[usize],
        pad_begin: &[usize],
        pad_end: &[usize],
        output: &[usize],
    ) -> OpResult<Geom3> {
        let g = Geom3 {
            input: lift(input, 1)?,
            kernel: lift(kernel, 1)?,
            strides: lift(strides, 1)?,
            dilations: lift(dilations, 1)?,
            pad_begin: lift(pad_begin, 0)?,
            pad_end: lift(pad_end, 0)?,
            output: lift(output, 1)?,
        };
        g.check_extent()?;
        Ok(g)
    }

    /// The kernels index with `o * stride + k * dilation - pad_begin` (and the reverse for
    /// ConvTranspose) in isize, and multiply the per-axis sizes. The parameters come from the
    /// model (an empty tensor may even carry huge dims), so every such value must fit.
    fn check_extent(&self) -> OpResult<()> {
        let fits = |v: Option<usize>| v.filter(|&v| isize::try_from(v).is_ok());
        for a in 0..3 {
            let reach = self.input[a]
                .max(self.output[a])
                .checked_mul(self.strides[a])
                .zip(self.kernel[a].checked_mul(self.dilations[a]))
                .and_then(|(p, k)| p.checked_add(k))
                .and_then(|v| v.checked_add(self.pad_begin[a]))
                .and_then(|v| v.checked_add(self.pad_end[a]));
            if fits(reach).is_none() {
                return Err(OpError(format!("window geometry overflows on spatial axis {a}: {self:?}")));
            }
        }
        for (what, dims) in [("input", &self.input), ("output", &self.output), ("kernel", &self.kernel)] {
            if fits(dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))).is_none() {
                return Err(OpError(format!("{what} spatial size {dims:?} overflows")));
            }
        }
        Ok(())
    }

    pub fn in_len(&self) -> usize {
        self.input.iter().product()
    }

    pub fn out_len(&self) -> usize {
        self.output.iter().product()
    }

    pub fn kernel_len(&self) -> usize {
        self.kernel.iter().product()
    }

    /// Offset of tap `k` along `axis` relative to `o * stride`: `k * dilation - pad_begin`.
    pub(crate) fn tap_offset(&self, axis: usize, k: usize) -> isize {
        (k * self.dilations[axis]) as isize - self.pad_begin[axis] as isize
    }

    /// The output positions `lo..hi` along `axis` whose input `o * stride + off` is inside the input.
    pub(crate) fn valid_outputs(&self, axis: usize, off: isize) -> (usize, usize) {
        let s = self.strides[axis] as isize;
        let n = self.input[axis] as isize;
        let lo = if off >= 0 { 0 } else { (-off + s - 1) / s };
        let hi = if n - off <= 0 { 0 } else { (n - off + s - 1) / s };
        let out = self.output[axis] as isize;
        let lo = lo.min(out) as usize;
        (lo, (hi.min(out) as usize).max(lo))
    }

    pub(crate) fn is_pointwise(&self) -> bool {
        self.kernel == [1; 3] && self.strides == [1; 3] && self.pad_begin == [0; 3] && self.input == self.output
    }
}

pub const OPS: &[OpSpec] = &[OpSpec::onnx("Conv", parse_conv), OpSpec::onnx("ConvTranspose", parse_conv_transpose)];

/// The `auto_pad` attribute of conv and pooling ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoPad {
    /// Explicit `pads`.
    NotSet,
    /// Output `ceil(in / stride)`; an odd total padding puts the extra cell at the end.
    SameUpper,
    /// Output `ceil(in / stride)`; an odd total padding puts the extra cell at the beginning.
    SameLower,
    /// No padding.
    Valid,
}

impl AutoPad {
    pub fn parse(ctx: &NodeCtx) -> OpResult<AutoPad> {
        Ok(match ctx.choice("auto_pad", "NOTSET", &["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])?.as_str() {
            "SAME_UPPER" => AutoPad::SameUpper,
            "SAME_LOWER" => AutoPad::SameLower,
            "VALID" => AutoPad::Valid,
            _ => AutoPad::NotSet,
        })
    }
}

/// Largest window attribute value (kernel size, stride, dilation, pad, output size) accepted.
/// Real models stay far below it; the bound keeps the window arithmetic of the shape inference
/// and the kernels (sums and products of a few such values in i64/isize) free of overflow.
pub(crate) const MAX_WINDOW_ATTR: i64 = i32::MAX as i64;

/// Reads an INTS attribute whose values must all be in `min..=MAX_WINDOW_ATTR`, as usize.
pub(crate) fn ints_at_least(ctx: &NodeCtx, name: &str, min: i64) -> OpResult<Option<Vec<usize>>> {
    match ctx.ints(name)? {
        None => Ok(None),
        Some(v) => {
            op_ensure!(v.iter().all(|&x| x >= min), "attribute '{name}' = {v:?} must have values >= {min}");
            op_ensure!(
                v.iter().all(|&x| x <= MAX_WINDOW_ATTR),
                "attribute '{name}' = {v:?} has a value above the supported maximum {MAX_WINDOW_ATTR}"
            );
            Ok(Some(v.into_iter().map(|x| x as usize).collect()))
        }
    }
}

/// `dilation * (kernel - 1) + 1`, the cells one window covers. Both factors come from the
/// model, so an overflow is a model error, not a panic; the result also fits in i64 (`Dim`).
fn window_span(kernel: usize, dilation: usize) -> OpResult<usize> {
    kernel
        .checked_sub(1)
        .and_then(|k| k.checked_mul(dilation))
        .and_then(|s| s.checked_add(1))
        .filter(|&s| i64::try_from(s).is_ok())
        .ok_or_else(|| crate::ir::OpError(format!("a window of kernel {kernel} with dilation {dilation} overflows")))
}

/// `a + b` for model-controlled sizes (pads, paddings), bounded to i64 like a `Dim`.
fn checked_sum(a: usize, b: usize, what: &str) -> OpResult<usize> {
    a.checked_add(b)
        .filter(|&s| i64::try_from(s).is_ok())
        .ok_or_else(|| crate::ir::OpError(format!("{what} {a} + {b} overflows")))
}

/// Sliding-window geometry as written in the node; resolved against the input's spatial dims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// `kernel_shape`; for convolutions it may be absent (taken from the weights).
    pub kernel: Option<Vec<usize>>,
    pub strides: Option<Vec<usize>>,
    pub dilations: Option<Vec<usize>>,
    /// `[begin..., end...]`, `2 * spatial rank` values; ignored unless `auto_pad` is NOTSET.
    pub pads: Option<Vec<usize>>,
    pub auto_pad: AutoPad,
    pub ceil_mode: bool,
}

/// The concrete per-axis window parameters of one spatial rank.
struct Params {
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pads: Vec<usize>,
}

impl Window {
    /// Reads `kernel_shape`, `strides`, `dilations`, `pads` and `auto_pad` (not `ceil_mode`).
    pub fn parse(ctx: &NodeCtx) -> OpResult<Window> {
        let kernel = ints_at_least(ctx, "kernel_shape", 1)?;
        let strides = ints_at_least(ctx, "strides", 1)?;
        let dilations = ints_at_least(ctx, "dilations", 1)?;
        let pads = ints_at_least(ctx, "pads", 0)?;
        let auto_pad = AutoPad::parse(ctx)?;
        Ok(Window { kernel, strides, dilations, pads, auto_pad, ceil_mode: false })
    }

    fn params(&self, rank: usize, kernel: &[usize]) -> OpResult<Params> {
        op_ensure!((1..=3).contains(&rank), "{rank} spatial dims are not supported (expected 1, 2 or 3)");
        op_ensure!(
            kernel.len() == rank,
            "kernel_shape {kernel:?} has {} dims, the input has {rank} spatial dims",
            kernel.len()
        );
        let get = |name: &str, v: &Option<Vec<usize>>, len: usize, default: usize| -> OpResult<Vec<usize>> {
            match v {
                None => Ok(vec![default; len]),
                Some(v) => {
                    op_ensure!(
                        v.len() == len,
                        "attribute '{name}' = {v:?} must have {len} values for {rank} spatial dims"
                    );
                    Ok(v.clone())
                }
            }
        };
        let pads =
            if self.auto_pad == AutoPad::NotSet { get("pads", &self.pads, 2 * rank, 0)? } else { vec![0; 2 * rank] };
        Ok(Params {
            strides: get("strides", &self.strides, rank, 1)?,
            dilations: get("dilations", &self.dilations, rank, 1)?,
            pads,
        })
    }

    /// Output spatial dims for (possibly symbolic) input spatial dims.
    pub fn out_dims(&self, input: &[Dim], kernel: &[usize]) -> OpResult<Vec<Dim>> {
        let p = self.params(input.len(), kernel)?;
        let mut out = Vec::with_capacity(input.len());
        for (i, d) in input.iter().enumerate() {
            let stride = Dim::from(p.strides[i]);
            if matches!(self.auto_pad, AutoPad::SameUpper | AutoPad::SameLower) {
                out.push(d.div_ceil(&stride));
                continue;
            }
            let span = window_span(kernel[i], p.dilations[i])?;
            let padded = d.add(&Dim::from(checked_sum(p.pads[i], p.pads[i + input.len()], "pads")?));
            if let Some(v) = padded.as_known() {
                op_ensure!(
                    v >= span as i64,
                    "a window of {span} cells (kernel {}, dilation {}) does not fit in spatial dim {i} of size {v} (padding included)",
                    kernel[i],
                    p.dilations[i]
                );
            }
            let num = padded.sub(&Dim::from(span));
            let o = if self.ceil_mode { num.div_ceil(&stride) } else { num.div_floor(&stride) }.add(&Dim::known(1));
            out.push(match (o.as_known(), d.as_known()) {
                // ceil_mode: a last window starting in the end padding is dropped (as in ONNX
                // Runtime and PyTorch).
                // i128: the stride and pad are model-controlled and may be near i64::MAX.
                (Some(ov), Some(dv))
                    if self.ceil_mode && (ov as i128 - 1) * p.strides[i] as i128 >= dv as i128 + p.pads[i] as i128 =>
                {
                    Dim::known(ov - 1)
                }
                _ => o,
            });
        }
        Ok(out)
    }

    /// Concrete geometry for concrete input spatial dims.
    pub fn resolve(&self, input: &[usize], kernel: &[usize]) -> OpResult<Geom3> {
        let rank = input.len();
        let p = self.params(rank, kernel)?;
        let out = self.out_dims(&crate::ir::dim::dims_of(input), kernel)?;
        let out = crate::ir::dim::known_shape(&out)
            .ok_or_else(|| crate::ir::OpError("window output size is not computable".into()))?;
        let (mut begin, mut end) = (p.pads[..rank].to_vec(), p.pads[rank..].to_vec());
        if matches!(self.auto_pad, AutoPad::SameUpper | AutoPad::SameLower) {
            for i in 0..rank {
                let span = window_span(kernel[i], p.dilations[i])?;
                let total = (out[i].max(1) - 1)
                    .checked_mul(p.strides[i])
                    .and_then(|t| t.checked_add(span))
                    .ok_or_else(|| {
                        crate::ir::OpError(format!(
                            "SAME padding of spatial dim {i} overflows (stride {})",
                            p.strides[i]
                        ))
                    })?
                    .saturating_sub(input[i]);
                let small = total / 2;
                (begin[i], end[i]) =
                    if self.auto_pad == AutoPad::SameUpper { (small, total - small) } else { (total - small, small) };
            }
        }
        Geom3::lift(input, kernel, &p.strides, &p.dilations, &begin, &end, &out)
    }
}

/// Shape checks shared by Conv and ConvTranspose: float input of rank 3..=5 and weights of the
/// same rank and dtype with compile-time spatial dims. Returns the kernel shape.
fn check_operands(op: &str, x: &Fact, w: &Fact, kernel_attr: &Option<Vec<usize>>) -> OpResult<Vec<usize>> {
    let dtype = x.dtype();
    op_ensure!(dtype.is_float(), "{op} needs a floating-point input, found {dtype}");
    op_ensure!(w.dtype() == dtype, "{op}: weights are {} but the input is {dtype}", w.dtype());
    op_ensure!(
        (3..=5).contains(&x.rank()),
        "{op} needs an input [N, C, spatial...] with 1 to 3 spatial dims, found {}",
        fmt_shape(x.shape())
    );
    op_ensure!(
        w.rank() == x.rank(),
        "{op}: weights {} and input {} differ in rank",
        fmt_shape(w.shape()),
        fmt_shape(x.shape())
    );
    let kernel = crate::ir::dim::known_shape(&w.shape()[2..]).ok_or_else(|| {
        crate::ir::OpError(format!(
            "{op}: the kernel size must be known at compile time, found weights {}",
            fmt_shape(w.shape())
        ))
    })?;
    if let Some(k) = kernel_attr {
        op_ensure!(*k == kernel, "{op}: kernel_shape {k:?} does not match the weights {}", fmt_shape(w.shape()));
    }
    op_ensure!(kernel.iter().all(|&k| k > 0), "{op}: weights {} have an empty kernel", fmt_shape(w.shape()));
    Ok(kernel)
}

fn check_bias(op: &str, b: Option<&Fact>, x: &Fact, k: &Dim) -> OpResult<()> {
    if let Some(b) = b {
        op_ensure!(
            b.dtype() == x.dtype() && b.shape() == [k.clone()],
            "{op}: bias must be {}[{k}], found {}{}",
            x.dtype(),
            b.dtype(),
            fmt_shape(b.shape())
        );
    }
    Ok(())
}

/// The operands of a conv eval as contiguous f32 data.
fn eval_operands<'a>(
    x: &'a Tensor,
    w: &'a Tensor,
) -> (std::borrow::Cow<'a, ArrayD<f32>>, std::borrow::Cow<'a, ArrayD<f32>>) {
    (f32_of(x), f32_of(w))
}

/// Convolution with optional bias.
#[derive(Clone, Debug)]
pub struct Conv {
    pub window: Window,
    pub group: usize,
}

impl Op for Conv {
    fn op_type(&self) -> &'static str {
        "Conv"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        let w = required(inputs, 1, "W")?;
        let kernel = check_operands("Conv", x, w, &self.window.kernel)?;
        let (c, cg, k) = (&x.shape()[1], &w.shape()[1], &w.shape()[0]);
        let g = self.group as i64;
        if let (Some(c), Some(cg)) = (c.as_known(), cg.as_known()) {
            let expected = cg
                .checked_mul(g)
                .ok_or_else(|| crate::ir::OpError(format!("Conv: group {g} x {cg} channels overflows")))?;
            op_ensure!(
                c == expected,
                "Conv: the input has {c} channels but the weights expect {cg} per group x {g} groups"
            );
        }
        if let Some(k) = k.as_known() {
            op_ensure!(k % g == 0, "Conv: {k} output channels do not divide into {g} groups");
        }
        check_bias("Conv", optional(inputs, 2), x, k)?;
        let mut out = vec![x.shape()[0].clone(), k.clone()];
        out.extend(self.window.out_dims(&x.shape()[2..], &kernel)?);
        Ok(vec![Fact::new(x.dtype(), out)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let xt = required(inputs, 0, "X")?;
        let wt = required(inputs, 1, "W")?;
        let (x, w) = eval_operands(xt, wt);
        let (xs, ws) = (x.shape(), w.shape());
        op_ensure!(xs.len() >= 3 && ws.len() == xs.len(), "Conv: input {xs:?} and weights {ws:?} do not fit");
        let geom = self.window.resolve(&xs[2..], &ws[2..])?;
        let bias = optional(inputs, 2).map(|b| b.to_f32());
        let bias_std = bias.as_ref().map(standard);
        let (x_std, w_std) = (standard(&x), standard(&w));
        let y = kernels::conv(
            contiguous(&x_std),
            xs[0],
            xs[1],
            contiguous(&w_std),
            ws[0],
            bias_std.as_ref().map(contiguous),
            &geom,
            self.group,
        )?;
        let mut shape = vec![xs[0], ws[0]];
        shape.extend_from_slice(&geom.output[3 - (xs.len() - 2)..]);
        let y = ArrayD::from_shape_vec(IxDyn(&shape), y).map_err(|e| crate::ir::OpError(e.to_string()))?;
        Ok(vec![into_dtype(Tensor::F32(y), xt.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn parse_group(ctx: &NodeCtx) -> OpResult<usize> {
    let g = ctx.int_or("group", 1)?;
    op_ensure!(g >= 1, "attribute 'group' = {g} must be >= 1");
    Ok(g as usize)
}

/// Conv. Opset history: 1 (all attributes present already: auto_pad, dilations, group,
/// kernel_shape, pads, strides), 11 only clarified that `kernel_shape` may be omitted (inferred
/// from the weights, which we always do and cross-check when given) and the `auto_pad`
/// default; 22 added bfloat16 types. One parser serves every version.
fn parse_conv(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(Conv { window: Window::parse(ctx)?, group: parse_group(ctx)? }))
}

/// Transposed convolution with optional bias.
#[derive(Clone, Debug)]
pub struct ConvTranspose {
    pub window: Window,
    pub group: usize,
    pub output_padding: Option<Vec<usize>>,
    /// Requested output spatial shape (the last `spatial rank` values of `output_shape`).
    pub output_shape: Option<Vec<usize>>,
}

impl ConvTranspose {
    /// Per-axis `(pad_begin, output size)` for input spatial dims that may be symbolic.
    fn spatial(&self, input: &[Dim], kernel: &[usize]) -> OpResult<Vec<(usize, Dim)>> {
        let rank = input.len();
        let p = self.window.params(rank, kernel)?;
        let out_pad = match &self.output_padding {
            None => vec![0; rank],
            Some(v) => {
                op_ensure!(v.len() == rank, "attribute 'output_padding' = {v:?} must have {rank} values");
                v.clone()
            }
        };
        let requested: Option<Vec<usize>> = match &self.output_shape {
            None => None,
            Some(v) if v.len() == rank => Some(v.clone()),
            Some(v) if v.len() == rank + 2 => Some(v[2..].to_vec()),
            Some(v) => op_bail!("attribute 'output_shape' = {v:?} must have {rank} (or {}) values", rank + 2),
        };
        let mut out = Vec::with_capacity(rank);
        for i in 0..rank {
            let span = window_span(kernel[i], p.dilations[i])?;
            let s = p.strides[i];
            op_ensure!(
                out_pad[i] < s.max(p.dilations[i]),
                "output_padding {} must be smaller than the stride {s} or dilation {}",
                out_pad[i],
                p.dilations[i]
            );
            // The full (unpadded) output size: stride * (in - 1) + output_padding + span.
            let full = input[i].sub(&Dim::known(1)).mul(&Dim::from(s)).add(&Dim::from(checked_sum(
                out_pad[i],
                span,
                "output_padding + window",
            )?));
            let target = match (&requested, self.window.auto_pad) {
                (Some(r), _) => Some(Dim::from(r[i])),
                (None, AutoPad::SameUpper | AutoPad::SameLower) => Some(input[i].mul(&Dim::from(s))),
                _ => None,
            };
            match target {
                None => {
                    let (b, e) = (p.pads[i], p.pads[i + rank]);
                    let o = full.sub(&Dim::from(checked_sum(b, e, "pads")?));
                    if let Some(v) = o.as_known() {
                        op_ensure!(v > 0, "ConvTranspose: pads {:?} leave no output along spatial dim {i}", p.pads);
                    }
                    out.push((b, o));
                }
                Some(t) => {
                    let total = full.sub(&t);
                    // The begin padding is needed to evaluate; with symbolic dims only inference
                    // runs, which needs nothing but the output size.
                    let total = total.as_known().map(|v| v.max(0) as usize).unwrap_or(0);
                    let small = total / 2;
                    // ONNX Runtime: SAME_UPPER trims the odd cell at the end, everything else
                    // (NOTSET with output_shape, SAME_LOWER) at the beginning.
                    let begin = if self.window.auto_pad == AutoPad::SameUpper { small } else { total - small };
                    out.push((begin, t));
                }
            }
        }
        Ok(out)
    }
}

impl Op for ConvTranspose {
    fn op_type(&self) -> &'static str {
        "ConvTranspose"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        let w = required(inputs, 1, "W")?;
        let kernel = check_operands("ConvTranspose", x, w, &self.window.kernel)?;
        let (c, wc) = (&x.shape()[1], &w.shape()[0]);
        if let (Some(c), Some(wc)) = (c.as_known(), wc.as_known()) {
            op_ensure!(
                c == wc,
                "ConvTranspose: the input has {c} channels but the weights {} expect {wc}",
                fmt_shape(w.shape())
            );
            op_ensure!(
                c % self.group as i64 == 0,
                "ConvTranspose: {c} input channels do not divide into {} groups",
                self.group
            );
        }
        let k = w.shape()[1].mul(&Dim::from(self.group));
        check_bias("ConvTranspose", optional(inputs, 2), x, &k)?;
        let mut out = vec![x.shape()[0].clone(), k];
        out.extend(self.spatial(&x.shape()[2..], &kernel)?.into_iter().map(|(_, d)| d));
        Ok(vec![Fact::new(x.dtype(), out)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let xt = required(inputs, 0, "X")?;
        let wt = required(inputs, 1, "W")?;
        let (x, w) = eval_operands(xt, wt);
        let (xs, ws) = (x.shape(), w.shape());
        op_ensure!(xs.len() >= 3 && ws.len() == xs.len(), "ConvTranspose: input {xs:?} and weights {ws:?} do not fit");
        let rank = xs.len() - 2;
        let sp = self.spatial(&crate::ir::dim::dims_of(&xs[2..]), &ws[2..])?;
        let p = self.window.params(rank, &ws[2..])?;
        let begin: Vec<usize> = sp.iter().map(|(b, _)| *b).collect();
        let out: Vec<usize> = sp.iter().map(|(_, d)| d.as_known().unwrap_or(0).max(0) as usize).collect();
        let geom = Geom3::lift(&xs[2..], &ws[2..], &p.strides, &p.dilations, &begin, &vec![0; rank], &out)?;
        let k = ws[1].checked_mul(self.group).ok_or_else(|| {
            crate::ir::OpError(format!("ConvTranspose: group {} x {} channels overflows", self.group, ws[1]))
        })?;
        let bias = optional(inputs, 2).map(|b| b.to_f32());
        let bias_std = bias.as_ref().map(standard);
        let (x_std, w_std) = (standard(&x), standard(&w));
        let y = kernels::conv_transpose(
            contiguous(&x_std),
            xs[0],
            xs[1],
            contiguous(&w_std),
            k,
            bias_std.as_ref().map(contiguous),
            &geom,
            self.group,
        )?;
        let mut shape = vec![xs[0], k];
        shape.extend_from_slice(&out);
        let y = ArrayD::from_shape_vec(IxDyn(&shape), y).map_err(|e| crate::ir::OpError(e.to_string()))?;
        Ok(vec![into_dtype(Tensor::F32(y), xt.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// ConvTranspose. Opset history: 1 has every attribute (auto_pad, dilations, group,
/// kernel_shape, output_padding, output_shape, pads, strides); 11 clarified the padding rules
/// for `output_shape`/`auto_pad` (total padding = stride*(in-1) + output_padding + span - out,
/// split like ONNX Runtime: SAME_UPPER puts the odd cell at the end, otherwise at the begin;
/// an `output_shape` larger than the full output pads zeros at the end); 22 added bfloat16.
fn parse_conv_transpose(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(ConvTranspose {
        window: Window::parse(ctx)?,
        group: parse_group(ctx)?,
        output_padding: ints_at_least(ctx, "output_padding", 0)?,
        output_shape: ints_at_least(ctx, "output_shape", 1)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ops::testutil::parse_node;
    use crate::ir::{Attr, DType};

    pub(crate) fn parse_op(op: &str, attrs: &[(&str, Attr)]) -> Box<dyn Op> {
        parse_node(op, 17, attrs, &[true, true], 1).expect("parses")
    }

    fn ints(v: &[i64]) -> Attr {
        Attr::Ints(v.to_vec())
    }

    fn close(got: &Tensor, want: &[f64]) {
        let g = got.to_f64_vec();
        assert_eq!(g.len(), want.len(), "{g:?} vs {want:?}");
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-4, "{g:?} vs {want:?}");
        }
    }

    #[test]
    fn infer_keeps_batch_symbolic_and_computes_spatial_dims() {
        let op = parse_op("Conv", &[("strides", ints(&[2, 2])), ("pads", ints(&[3, 3, 3, 3]))]);
        let n = Dim::sym("N");
        let x = Fact::new(DType::F32, vec![n.clone(), Dim::known(3), Dim::known(224), Dim::known(224)]);
        let w = Fact::new(DType::F32, vec![Dim::known(64), Dim::known(3), Dim::known(7), Dim::known(7)]);
        let out = op.infer(&[Some(&x), Some(&w), None]).unwrap();
        assert_eq!(out[0].shape(), &[n.clone(), Dim::known(64), Dim::known(112), Dim::known(112)]);
        // Symbolic spatial dims stay expressions; SAME gives ceil(H / stride).
        let h = Dim::sym("H");
        let xs = Fact::new(DType::F32, vec![n.clone(), Dim::known(3), h.clone(), Dim::known(9)]);
        let same = parse_op("Conv", &[("strides", ints(&[2, 2])), ("auto_pad", Attr::String("SAME_UPPER".into()))]);
        let out = same.infer(&[Some(&xs), Some(&w)]).unwrap();
        assert_eq!(out[0].shape()[2], h.div_ceil(&Dim::known(2)));
        assert_eq!(out[0].shape()[3], Dim::known(5));
    }

    #[test]
    fn infer_errors_are_clear() {
        let op = parse_op("Conv", &[("group", Attr::Int(2))]);
        let x = Fact::new(DType::F32, vec![Dim::known(1), Dim::known(6), Dim::known(8), Dim::known(8)]);
        let w = Fact::new(DType::F32, vec![Dim::known(4), Dim::known(2), Dim::known(3), Dim::known(3)]);
        let e = op.infer(&[Some(&x), Some(&w)]).unwrap_err();
        assert!(e.0.contains("6 channels") && e.0.contains("2 groups"), "{}", e.0);
        let small = Fact::new(DType::F32, vec![Dim::known(1), Dim::known(4), Dim::known(2), Dim::known(8)]);
        let e = op.infer(&[Some(&small), Some(&w)]).unwrap_err();
        assert!(e.0.contains("does not fit"), "{}", e.0);
        let bad_k = parse_op("Conv", &[("kernel_shape", ints(&[5, 5]))]);
        let w1 = Fact::new(DType::F32, vec![Dim::known(4), Dim::known(6), Dim::known(3), Dim::known(3)]);
        assert!(bad_k.infer(&[Some(&x), Some(&w1)]).unwrap_err().0.contains("kernel_shape"));
        let auto_pad = [("auto_pad", Attr::String("SAME".into()))];
        assert!(parse_node("Conv", 17, &auto_pad, &[true, true], 1).unwrap_err().0.contains("auto_pad"));
    }

    #[test]
    fn conv_eval_matches_onnxruntime() {
        // ORT: x = arange(10)-3 as [1,1,10], w = [1,-1,2], strides 2, pads [2,1], dilations 2.
        let x = Tensor::from_f32s(&[1, 1, 10], (0..10).map(|v| v as f32 - 3.0).collect());
        let w = Tensor::from_f32s(&[1, 1, 3], vec![1.0, -1.0, 2.0]);
        let op = parse_op("Conv", &[("strides", ints(&[2])), ("pads", ints(&[2, 1])), ("dilations", ints(&[2]))]);
        let y = op.eval(&[Some(&x), Some(&w), None]).unwrap();
        assert_eq!(y[0].shape(), &[1, 1, 5]);
        close(&y[0], &[1.0, 0.0, 4.0, 8.0, -2.0]);
        // ORT: x = 1..9 as [1,1,3,3], w = [[1,2],[3,4]].
        let x = Tensor::from_f32s(&[1, 1, 3, 3], (1..10).map(|v| v as f32).collect());
        let w = Tensor::from_f32s(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let lower = parse_op("Conv", &[("auto_pad", Attr::String("SAME_LOWER".into()))]);
        close(&lower.eval(&[Some(&x), Some(&w)]).unwrap()[0], &[4., 11., 18., 18., 37., 47., 36., 67., 77.]);
        let upper = parse_op("Conv", &[("auto_pad", Attr::String("SAME_UPPER".into())), ("strides", ints(&[2, 2]))]);
        let y = upper.eval(&[Some(&x), Some(&w)]).unwrap();
        assert_eq!(y[0].shape(), &[1, 1, 2, 2]);
        close(&y[0], &[37., 21., 23., 9.]);
        // f16 in, f16 out, with bias.
        let b = Tensor::from_f32s(&[1], vec![0.5]).cast(DType::F16);
        let y = lower.eval(&[Some(&x.cast(DType::F16)), Some(&w.cast(DType::F16)), Some(&b)]).unwrap();
        assert_eq!(y[0].dtype(), DType::F16);
        close(&y[0], &[4.5, 11.5, 18.5, 18.5, 37.5, 47.5, 36.5, 67.5, 77.5]);
    }

    #[test]
    fn conv_transpose_padding_rules_match_onnxruntime() {
        // ORT: x = [1,2,3] as [1,1,3], w = ones [1,1,3], strides 2.
        let x = Tensor::from_f32s(&[1, 1, 3], vec![1.0, 2.0, 3.0]);
        let w = Tensor::from_f32s(&[1, 1, 3], vec![1.0; 3]);
        let cases: &[(&[(&str, Attr)], &[f64])] = &[
            (&[], &[1., 1., 3., 2., 5., 3., 3.]),
            (&[("output_shape", ints(&[6]))], &[1., 3., 2., 5., 3., 3.]),
            (&[("output_shape", ints(&[8]))], &[1., 1., 3., 2., 5., 3., 3., 0.]),
            (&[("auto_pad", Attr::String("SAME_UPPER".into()))], &[1., 1., 3., 2., 5., 3.]),
            (&[("auto_pad", Attr::String("SAME_LOWER".into()))], &[1., 3., 2., 5., 3., 3.]),
            (&[("output_padding", ints(&[1]))], &[1., 1., 3., 2., 5., 3., 3., 0.]),
            (&[("pads", ints(&[1, 2]))], &[1., 3., 2., 5.]),
        ];
        for (extra, want) in cases {
            let mut attrs: Vec<(&str, Attr)> = vec![("strides", ints(&[2]))];
            attrs.extend(extra.iter().cloned());
            let op = parse_op("ConvTranspose", &attrs);
            let fx = Fact::new(DType::F32, vec![Dim::known(1), Dim::known(1), Dim::known(3)]);
            let fw = Fact::new(DType::F32, vec![Dim::known(1), Dim::known(1), Dim::known(3)]);
            let inferred = op.infer(&[Some(&fx), Some(&fw)]).unwrap();
            let y = op.eval(&[Some(&x), Some(&w)]).unwrap();
            assert_eq!(inferred[0].shape()[2].as_known(), Some(y[0].shape()[2] as i64), "{extra:?}");
            close(&y[0], want);
        }
    }

    #[test]
    fn conv_transpose_groups_and_symbolic_batch() {
        let op = parse_op("ConvTranspose", &[("group", Attr::Int(2)), ("strides", ints(&[2, 2]))]);
        let n = Dim::sym("N");
        let x = Fact::new(DType::F32, vec![n.clone(), Dim::known(4), Dim::sym("H"), Dim::known(5)]);
        let w = Fact::new(DType::F32, vec![Dim::known(4), Dim::known(3), Dim::known(2), Dim::known(2)]);
        let out = op.infer(&[Some(&x), Some(&w)]).unwrap();
        assert_eq!(out[0].shape()[0], n);
        assert_eq!(out[0].shape()[1], Dim::known(6));
        assert_eq!(out[0].shape()[2], Dim::sym("H").mul(&Dim::known(2)));
        assert_eq!(out[0].shape()[3], Dim::known(10));
    }

    #[test]
    fn model_controlled_sizes_that_overflow_are_errors() {
        let x = Fact::new(DType::F32, vec![Dim::known(1), Dim::known(3), Dim::known(8), Dim::known(8)]);
        let w = Fact::new(DType::F32, vec![Dim::known(4), Dim::known(3), Dim::known(3), Dim::known(3)]);
        let err =
            |op: &str, attrs: &[(&str, Attr)], w: &Fact| parse_op(op, attrs).infer(&[Some(&x), Some(w)]).unwrap_err().0;
        let e = err("Conv", &[("group", Attr::Int(i64::MAX))], &w);
        assert!(e.contains("group 9223372036854775807 x 3 channels overflows"), "{e}");
        // Window attributes are bounded when parsed.
        for name in ["strides", "dilations", "pads", "kernel_shape"] {
            let attrs = [(name, ints(&[i64::MAX, 1, 1, 1]))];
            let e = parse_node("Conv", 17, &attrs, &[true, true], 1).unwrap_err().0;
            assert!(e.contains("above the supported maximum 2147483647"), "{name}: {e}");
        }
        // A kernel declared huge by the weights' type: dilation x kernel overflows.
        let big = Fact::new(DType::F32, vec![Dim::known(4), Dim::known(3), Dim::known(1 << 62), Dim::known(3)]);
        let e = err("Conv", &[("dilations", ints(&[4, 1]))], &big);
        assert!(e.contains("a window of kernel 4611686018427387904 with dilation 4 overflows"), "{e}");
        let big_t = Fact::new(DType::F32, vec![Dim::known(3), Dim::known(4), Dim::known(1 << 62), Dim::known(3)]);
        let e = err("ConvTranspose", &[("dilations", ints(&[4, 1]))], &big_t);
        assert!(e.contains("overflows"), "{e}");
        // The largest stride gives one output cell and must not overflow the ceil_mode check or
        // the SAME padding.
        let mut window = Window {
            kernel: None,
            strides: Some(vec![MAX_WINDOW_ATTR as usize]),
            dilations: None,
            pads: None,
            auto_pad: AutoPad::NotSet,
            ceil_mode: true,
        };
        assert_eq!(window.out_dims(&[Dim::known(8)], &[3]).unwrap(), vec![Dim::known(1)]);
        window.auto_pad = AutoPad::SameUpper;
        assert_eq!(window.resolve(&[8], &[3]).unwrap().out_len(), 1);
        // ConvTranspose's output channel count (weights' per-group channels x group).
        let ct = parse_op("ConvTranspose", &[("group", Attr::Int(i64::MAX))]);
        let t = |shape: &[usize]| Tensor::F32(ArrayD::zeros(IxDyn(shape)));
        let e = ct.eval(&[Some(&t(&[1, 0, 2, 2])), Some(&t(&[0, 3, 1, 1]))]).unwrap_err().0;
        assert!(e.contains("overflows"), "{e}");
    }
}
