//! Fused 2-D convolution: conv + per-channel bias + residual add + activation, in one kernel.

use super::act::Act;
use super::Layout;
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, Dim, Fact, Op, OpError, OpResult, Tensor};
use crate::reference::kernel::conv as kernels;
use crate::{op_bail, op_ensure};
use std::any::Any;
use std::fmt;

/// Geometry of a 2-D convolution or pooling window. `pads` is ONNX order:
/// `[top, left, bottom, right]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeom {
    pub strides: [usize; 2],
    pub pads: [usize; 4],
    pub dilations: [usize; 2],
    pub group: usize,
}

impl ConvGeom {
    /// Output spatial size of one axis (`axis` 0 = H, 1 = W) for a window of `k` taps.
    pub fn out_dim(&self, axis: usize, input: &Dim, k: usize) -> OpResult<Dim> {
        let span = self.dilations[axis] * (k.max(1) - 1) + 1;
        let padded = input.add(&Dim::from(self.pads[axis] + self.pads[axis + 2]));
        if let Some(p) = padded.as_known() {
            op_ensure!(p >= span as i64, "window of {span} taps does not fit in padded input size {p}");
        }
        Ok(padded.sub(&Dim::from(span)).div_floor(&Dim::from(self.strides[axis])).add(&Dim::known(1)))
    }

    /// Parses the leaf spelling `s1,1:p0,0,0,0:d1,1:g1`.
    pub fn parse(token: &str) -> OpResult<ConvGeom> {
        let bad = || {
            OpError(format!(
                "malformed convolution geometry '{token}' (expected s<h>,<w>:p<t>,<l>,<b>,<r>:d<h>,<w>:g<n>)"
            ))
        };
        let fields: Vec<&str> = token.split(':').collect();
        if fields.len() != 4 {
            return Err(bad());
        }
        let nums = |f: &str, tag: char, n: usize| -> OpResult<Vec<usize>> {
            let body = f.strip_prefix(tag).ok_or_else(bad)?;
            let v: Vec<usize> =
                body.split(',').map(|x| x.parse::<usize>()).collect::<Result<_, _>>().map_err(|_| bad())?;
            if v.len() == n {
                Ok(v)
            } else {
                Err(bad())
            }
        };
        let s = nums(fields[0], 's', 2)?;
        let p = nums(fields[1], 'p', 4)?;
        let d = nums(fields[2], 'd', 2)?;
        let g = nums(fields[3], 'g', 1)?;
        let geom =
            ConvGeom { strides: [s[0], s[1]], pads: [p[0], p[1], p[2], p[3]], dilations: [d[0], d[1]], group: g[0] };
        op_ensure!(
            geom.strides.iter().chain(&geom.dilations).all(|&v| v > 0) && geom.group > 0,
            "convolution geometry '{token}': strides, dilations and group must be positive"
        );
        Ok(geom)
    }
}

impl fmt::Display for ConvGeom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [sh, sw] = self.strides;
        let [pt, pl, pb, pr] = self.pads;
        let [dh, dw] = self.dilations;
        write!(f, "s{sh},{sw}:p{pt},{pl},{pb},{pr}:d{dh},{dw}:g{}", self.group)
    }
}

/// `act(conv(x, w) + bias + residual)`.
///
/// Inputs: `x`, `w`, optional `bias` `[K]`, optional `residual` (the output's shape). In
/// `Layout::Nchw`, `x` is `[N,C,H,W]` and `w` is `[K,C/g,R,S]` (ONNX); in `Layout::Nhwc`, `x` is
/// `[N,H,W,C]` and `w` is KRSC `[K,R,S,C/g]`, and the output is `[N,P,Q,K]`.
#[derive(Clone, Debug)]
pub struct Conv2d {
    pub layout: Layout,
    pub geom: ConvGeom,
    pub act: Option<Act>,
    /// An activation applied to `conv + bias` *before* the residual add:
    /// `act(pre_act(conv(x, w) + bias) + residual)` (the `relu(conv) + x` pattern).
    pub pre_act: Option<Act>,
}

impl Conv2d {
    fn dims<'a>(&self, x: &'a [Dim], w: &'a [Dim]) -> (&'a Dim, [&'a Dim; 2], &'a Dim, &'a Dim, [&'a Dim; 2]) {
        match self.layout {
            Layout::Nchw => (&x[0], [&x[2], &x[3]], &x[1], &w[1], [&w[2], &w[3]]),
            Layout::Nhwc => (&x[0], [&x[1], &x[2]], &x[3], &w[3], [&w[1], &w[2]]),
        }
    }
}

impl Op for Conv2d {
    fn op_type(&self) -> &'static str {
        "Conv2d"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        let w = required(inputs, 1, "W")?;
        let dtype = x.dtype();
        op_ensure!(dtype.is_float(), "convolution input must be floating point, found {dtype}");
        op_ensure!(w.dtype() == dtype, "weights are {} but the input is {dtype}", w.dtype());
        op_ensure!(
            x.rank() == 4 && w.rank() == 4,
            "Conv2d needs rank-4 input and weights, found {} and {}",
            fmt_shape(x.shape()),
            fmt_shape(w.shape())
        );
        let (n, [h, wd], c, cg, [r, s]) = self.dims(x.shape(), w.shape());
        let k = &w.shape()[0];
        let g = self.geom.group;
        let (Some(r), Some(s)) = (r.as_known(), s.as_known()) else {
            op_bail!("kernel size must be known at compile time, found weights {}", fmt_shape(w.shape()))
        };
        if let (Some(c), Some(cg)) = (c.as_known(), cg.as_known()) {
            op_ensure!(c == cg * g as i64, "input has {c} channels but weights expect {cg} per group × {g} groups");
        }
        if let Some(k) = k.as_known() {
            op_ensure!(k % g as i64 == 0, "{k} output channels do not divide into {g} groups");
        }
        let p = self.geom.out_dim(0, h, r as usize)?;
        let q = self.geom.out_dim(1, wd, s as usize)?;
        let out = match self.layout {
            Layout::Nchw => vec![n.clone(), k.clone(), p, q],
            Layout::Nhwc => vec![n.clone(), p, q, k.clone()],
        };
        if let Some(b) = optional(inputs, 2) {
            op_ensure!(
                b.dtype() == dtype && b.shape() == [k.clone()],
                "bias must be {dtype}[{k}], found {}{}",
                b.dtype(),
                fmt_shape(b.shape())
            );
        }
        if let Some(res) = optional(inputs, 3) {
            op_ensure!(
                res.dtype() == dtype && res.shape() == out.as_slice(),
                "residual must be {dtype}{}, found {}{}",
                fmt_shape(&out),
                res.dtype(),
                fmt_shape(res.shape())
            );
        }
        Ok(vec![Fact::new(dtype, out)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        let w = required(inputs, 1, "W")?;
        let bias = optional(inputs, 2).map(|t| t.to_f32());
        let res = optional(inputs, 3).map(|t| t.to_f32());
        let out = kernels::conv2d(
            self.layout,
            &self.geom,
            &x.to_f32(),
            &w.to_f32(),
            bias.as_ref(),
            res.as_ref(),
            self.pre_act,
            self.act,
        )?;
        Ok(vec![Tensor::F32(out).cast(x.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
