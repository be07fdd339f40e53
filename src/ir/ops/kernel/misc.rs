//! Layout transforms, views, reductions, pooling and layernorm kernels.

use super::conv::ConvGeom;
use super::Layout;
use crate::ir::broadcast::{normalize_axes, normalize_axis};
use crate::ir::dim::{fmt_shape, product};
use crate::ir::{optional, required, Dim, Fact, Op, OpError, OpResult, Tensor};
use crate::reference::kernel::misc as kernels;
use crate::{map_tensor, op_bail, op_ensure};
use std::any::Any;
use std::fmt;

/// Permutes axes (any dtype). Priced by the bytes it moves: layout changes are never free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transpose {
    pub perm: Vec<usize>,
}

impl Transpose {
    pub fn new(perm: Vec<usize>) -> OpResult<Transpose> {
        let mut seen = vec![false; perm.len()];
        for &p in &perm {
            op_ensure!(p < perm.len() && !seen[p], "{perm:?} is not a permutation");
            seen[p] = true;
        }
        Ok(Transpose { perm })
    }

    /// Parses the leaf spelling `[0,2,3,1]`.
    pub fn parse_perm(token: &str) -> OpResult<Vec<usize>> {
        let body = token
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .ok_or_else(|| OpError(format!("malformed permutation '{token}' (expected [0,2,3,1])")))?;
        if body.is_empty() {
            return Ok(Vec::new());
        }
        body.split(',')
            .map(|p| p.parse::<usize>().map_err(|_| OpError(format!("malformed permutation '{token}'"))))
            .collect()
    }

    pub fn perm_token(perm: &[usize]) -> String {
        let p: Vec<String> = perm.iter().map(|v| v.to_string()).collect();
        format!("[{}]", p.join(","))
    }
}

/// `a` with its axes permuted, in standard layout. Writing into a fresh array with `assign`
/// walks the permuted view with Zip's strided inner loop; `as_standard_layout` on a permuted
/// view steps a dynamic-rank index per element (several times slower on conv weights).
fn permute<T: Clone + Default>(a: &ndarray::ArrayD<T>, perm: &[usize]) -> ndarray::ArrayD<T> {
    let view = a.view().permuted_axes(ndarray::IxDyn(perm));
    let mut out = ndarray::ArrayD::from_elem(view.raw_dim(), T::default());
    out.assign(&view);
    out
}

impl Op for Transpose {
    fn op_type(&self) -> &'static str {
        "Transpose"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        op_ensure!(
            x.rank() == self.perm.len(),
            "permutation {:?} does not fit shape {}",
            self.perm,
            fmt_shape(x.shape())
        );
        let shape = self.perm.iter().map(|&p| x.shape()[p].clone()).collect();
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        op_ensure!(x.rank() == self.perm.len(), "permutation {:?} does not fit shape {:?}", self.perm, x.shape());
        Ok(vec![map_tensor!(x, a => permute(a, &self.perm))])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// ONNX `Flatten` semantics: `[d0..d(axis-1)] × [d(axis)..]` as a 2-D view (no data movement).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flatten {
    pub axis: usize,
}

impl Op for Flatten {
    fn op_type(&self) -> &'static str {
        "Flatten"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        op_ensure!(self.axis <= x.rank(), "axis {} is out of range for rank {}", self.axis, x.rank());
        let shape = vec![product(&x.shape()[..self.axis]), product(&x.shape()[self.axis..])];
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        op_ensure!(self.axis <= x.rank(), "axis {} is out of range for rank {}", self.axis, x.rank());
        let outer: usize = x.shape()[..self.axis].iter().product();
        let inner: usize = x.shape()[self.axis..].iter().product();
        Ok(vec![x.reshaped(&[outer, inner]).ok_or_else(|| OpError("flatten: element count mismatch".into()))?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Views a per-channel tensor (every dim 1 except at most one) as `[C, 1 × trailing_ones]`:
/// `trailing_ones = 0` gives the plain vector a conv/gemm bias input takes, `2` the `[C,1,1]`
/// that broadcasts over an NCHW activation. No data movement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelView {
    pub trailing_ones: usize,
}

impl ChannelView {
    /// The channel count of a per-channel shape, or `None` when two dims exceed 1.
    pub fn channels(shape: &[Dim]) -> Option<Dim> {
        let one = Dim::known(1);
        let big: Vec<&Dim> = shape.iter().filter(|d| **d != one).collect();
        match big.len() {
            0 => Some(one),
            1 => Some(big[0].clone()),
            _ => None,
        }
    }
}

impl Op for ChannelView {
    fn op_type(&self) -> &'static str {
        "ChannelView"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        let Some(c) = ChannelView::channels(x.shape()) else {
            op_bail!("shape {} is not per-channel (more than one dim exceeds 1)", fmt_shape(x.shape()))
        };
        let mut shape = vec![c];
        shape.extend(std::iter::repeat_n(Dim::known(1), self.trailing_ones));
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        let mut shape = vec![x.len()];
        shape.extend(std::iter::repeat_n(1, self.trailing_ones));
        Ok(vec![x.reshaped(&shape).ok_or_else(|| OpError("channel view: element count mismatch".into()))?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Mean over `axes` (normalised, sorted), keeping reduced dims as 1 when `keepdims`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReduceMean {
    pub axes: Vec<i64>,
    pub keepdims: bool,
}

impl ReduceMean {
    /// Parses the leaf spelling `-1;k1` (axes separated by commas, then keepdims).
    pub fn parse(token: &str) -> OpResult<ReduceMean> {
        let bad = || OpError(format!("malformed reduction '{token}' (expected <axes>;k<0|1>, e.g. -1;k1)"));
        let (axes, keep) = token.split_once(';').ok_or_else(bad)?;
        let keepdims = match keep {
            "k1" => true,
            "k0" => false,
            _ => return Err(bad()),
        };
        let axes = axes.split(',').map(|a| a.parse::<i64>().map_err(|_| bad())).collect::<OpResult<Vec<i64>>>()?;
        Ok(ReduceMean { axes, keepdims })
    }

    pub fn token(&self) -> String {
        let a: Vec<String> = self.axes.iter().map(|v| v.to_string()).collect();
        format!("{};k{}", a.join(","), u8::from(self.keepdims))
    }
}

impl Op for ReduceMean {
    fn op_type(&self) -> &'static str {
        "ReduceMean"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        op_ensure!(x.dtype().is_float(), "mean reduction computes on floating-point tensors, found {}", x.dtype());
        let axes = normalize_axes(&self.axes, x.rank())?;
        let mut shape = Vec::new();
        for (i, d) in x.shape().iter().enumerate() {
            if !axes.contains(&i) {
                shape.push(d.clone());
            } else if self.keepdims {
                shape.push(Dim::known(1));
            }
        }
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let axes = normalize_axes(&self.axes, x.rank())?;
        Ok(vec![Tensor::F32(kernels::reduce_mean(&x.to_f32(), &axes, self.keepdims)).cast(x.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `(x - mean) / sqrt(var + eps) * scale + bias` over the axes from `axis` to the last
/// (population variance). Inputs: `x`, `scale`, optional `bias`, both broadcastable to the
/// normalised trailing shape.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNorm {
    pub axis: i64,
    pub eps: f32,
}

impl Op for LayerNorm {
    fn op_type(&self) -> &'static str {
        "LayerNorm"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        let scale = required(inputs, 1, "scale")?;
        op_ensure!(x.dtype().is_float(), "layernorm computes on floating-point tensors, found {}", x.dtype());
        let axis = normalize_axis(self.axis, x.rank())?;
        let inner = &x.shape()[axis..];
        for (what, f) in [("scale", Some(scale)), ("bias", optional(inputs, 2))] {
            let Some(f) = f else { continue };
            op_ensure!(f.dtype() == x.dtype(), "{what} is {} but X is {}", f.dtype(), x.dtype());
            let joined = crate::ir::broadcast::broadcast_shapes(&[inner, f.shape()])?;
            op_ensure!(
                joined == inner,
                "{what} {} does not broadcast to the normalised shape {}",
                fmt_shape(f.shape()),
                fmt_shape(inner)
            );
        }
        Ok(vec![Fact::new(x.dtype(), x.shape().to_vec())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        let axis = normalize_axis(self.axis, x.rank())?;
        let scale = required(inputs, 1, "scale")?.to_f32();
        let bias = optional(inputs, 2).map(|t| t.to_f32());
        let out = kernels::layer_norm(&x.to_f32(), axis, self.eps, &scale, bias.as_ref())?;
        Ok(vec![Tensor::F32(out).cast(x.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Max,
    Avg { count_include_pad: bool },
}

/// 2-D max or average pooling in either layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pool {
    pub kind: PoolKind,
    pub layout: Layout,
    pub kernel: [usize; 2],
    /// Strides, pads, dilations (group is 1).
    pub geom: ConvGeom,
    pub ceil_mode: bool,
}

impl Pool {
    /// Output size of one spatial axis, with ONNX/PyTorch ceil-mode semantics (a last window
    /// that would start in the right padding is dropped).
    pub fn out_dim(&self, axis: usize, input: &Dim) -> OpResult<Dim> {
        if !self.ceil_mode {
            return self.geom.out_dim(axis, input, self.kernel[axis]);
        }
        let Some(h) = input.as_known() else { op_bail!("ceil-mode pooling needs a known spatial size, found {input}") };
        let span = (self.geom.dilations[axis] * (self.kernel[axis] - 1) + 1) as i64;
        let padded = h + (self.geom.pads[axis] + self.geom.pads[axis + 2]) as i64;
        op_ensure!(padded >= span, "window of {span} taps does not fit in padded input size {padded}");
        let s = self.geom.strides[axis] as i64;
        let mut out = (padded - span + s - 1) / s + 1;
        if (out - 1) * s >= h + self.geom.pads[axis] as i64 {
            out -= 1;
        }
        Ok(Dim::known(out))
    }

    /// Parses the leaf spelling `max:k3,3:s2,2:p1,1,1,1:d1,1:c0` (`avg0`/`avg1` for average
    /// pooling without/with padding counted).
    pub fn parse(token: &str, layout: Layout) -> OpResult<Pool> {
        let bad =
            || OpError(format!("malformed pooling '{token}' (expected max|avg0|avg1:k<h>,<w>:s..:p..:d..:c<0|1>)"));
        let f: Vec<&str> = token.split(':').collect();
        if f.len() != 6 {
            return Err(bad());
        }
        let kind = match f[0] {
            "max" => PoolKind::Max,
            "avg0" => PoolKind::Avg { count_include_pad: false },
            "avg1" => PoolKind::Avg { count_include_pad: true },
            _ => return Err(bad()),
        };
        let k: Vec<usize> = f[1]
            .strip_prefix('k')
            .ok_or_else(bad)?
            .split(',')
            .map(|v| v.parse().map_err(|_| bad()))
            .collect::<OpResult<_>>()?;
        if k.len() != 2 || k.contains(&0) {
            return Err(bad());
        }
        let geom = ConvGeom::parse(&format!("{}:{}:{}:g1", f[2], f[3], f[4]))?;
        let ceil_mode = match f[5] {
            "c0" => false,
            "c1" => true,
            _ => return Err(bad()),
        };
        Ok(Pool { kind, layout, kernel: [k[0], k[1]], geom, ceil_mode })
    }

    pub fn token(&self) -> String {
        let kind = match self.kind {
            PoolKind::Max => "max",
            PoolKind::Avg { count_include_pad: false } => "avg0",
            PoolKind::Avg { count_include_pad: true } => "avg1",
        };
        let g = self.geom.to_string();
        let g = g.rsplit_once(':').map(|(a, _)| a).unwrap_or(&g);
        format!("{kind}:k{},{}:{g}:c{}", self.kernel[0], self.kernel[1], u8::from(self.ceil_mode))
    }
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.token())
    }
}

impl Op for Pool {
    fn op_type(&self) -> &'static str {
        "Pool"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        op_ensure!(x.dtype().is_float(), "pooling computes on floating-point tensors, found {}", x.dtype());
        op_ensure!(x.rank() == 4, "2-D pooling needs a rank-4 input, found {}", fmt_shape(x.shape()));
        let s = x.shape();
        let out = match self.layout {
            Layout::Nchw => vec![s[0].clone(), s[1].clone(), self.out_dim(0, &s[2])?, self.out_dim(1, &s[3])?],
            Layout::Nhwc => vec![s[0].clone(), self.out_dim(0, &s[1])?, self.out_dim(1, &s[2])?, s[3].clone()],
        };
        Ok(vec![Fact::new(x.dtype(), out)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        let out = kernels::pool(self, &x.to_f32())?;
        Ok(vec![Tensor::F32(out).cast(x.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Mean over the spatial axes of a rank-4 tensor: `[N,C,1,1]` (NCHW), `[N,1,1,C]` (NHWC), or
/// `[N,C]` when `flatten` (the `GlobalAveragePool → Flatten` of classifier heads).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GlobalAvgPool {
    pub layout: Layout,
    pub flatten: bool,
}

impl Op for GlobalAvgPool {
    fn op_type(&self) -> &'static str {
        "GlobalAvgPool"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        op_ensure!(x.dtype().is_float(), "pooling computes on floating-point tensors, found {}", x.dtype());
        op_ensure!(x.rank() == 4, "global pooling kernel needs a rank-4 input, found {}", fmt_shape(x.shape()));
        let s = x.shape();
        let one = Dim::known(1);
        let c = match self.layout {
            Layout::Nchw => s[1].clone(),
            Layout::Nhwc => s[3].clone(),
        };
        let out = match (self.flatten, self.layout) {
            (true, _) => vec![s[0].clone(), c],
            (false, Layout::Nchw) => vec![s[0].clone(), c, one.clone(), one],
            (false, Layout::Nhwc) => vec![s[0].clone(), one.clone(), one, c],
        };
        Ok(vec![Fact::new(x.dtype(), out)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        op_ensure!(x.rank() == 4, "global pooling kernel needs a rank-4 input, found {:?}", x.shape());
        let axes: &[usize] = match self.layout {
            Layout::Nchw => &[2, 3],
            Layout::Nhwc => &[1, 2],
        };
        let out = kernels::reduce_mean(&x.to_f32(), axes, !self.flatten);
        Ok(vec![Tensor::F32(out).cast(x.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
