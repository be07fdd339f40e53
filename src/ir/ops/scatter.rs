//! The scatter op family: indexed reads and writes addressed by index tensors — GatherND,
//! ScatterND, ScatterElements, Scatter (the deprecated opset 9 name of ScatterElements) and
//! OneHot.
//!
//! Index values are data (they may come from graph inputs), so they are checked at run time by
//! the kernels; everything the output shape depends on (index tuple length, OneHot depth) must
//! be known at compile time, except OneHot's depth (a data-dependent dim when it is not).

use super::OpSpec;
use crate::ir::broadcast::normalize_axis;
use crate::ir::dim::fmt_shape;
use crate::ir::{required, DType, Dim, Elem, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::reference::scatter::{self as kernels, combiner};
use crate::{op_bail, op_ensure};
use std::any::Any;

/// How ScatterND / ScatterElements combine an update with the value already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// Overwrite (with duplicate indices, the last update in index order wins).
    None,
    Add,
    Mul,
    Max,
    Min,
}

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("GatherND", parse_gather_nd),
    OpSpec::onnx("OneHot", parse_one_hot),
    OpSpec::onnx("Scatter", parse_scatter),
    OpSpec::onnx("ScatterElements", parse_scatter_elements),
    OpSpec::onnx("ScatterND", parse_scatter_nd),
];

/// Runs `$body` (an `OpResult<ArrayD<T>>`) with `$d`/`$u` bound to the data and updates arrays
/// of the same element type and `$f` to the combining function of `$red`; wraps the result back
/// into a `Tensor`. Bool tensors only support plain overwriting.
macro_rules! with_scatter_types {
    ($data:expr, $upd:expr, $red:expr, |$d:ident, $u:ident, $f:ident| $body:expr) => {
        match ($data, $upd) {
            (Tensor::F32($d), Tensor::F32($u)) => {
                let $f = combiner::<f32>($red);
                Tensor::F32($body?)
            }
            (Tensor::F64($d), Tensor::F64($u)) => {
                let $f = combiner::<f64>($red);
                Tensor::F64($body?)
            }
            (Tensor::F16($d), Tensor::F16($u)) => {
                let $f = combiner::<half::f16>($red);
                Tensor::F16($body?)
            }
            (Tensor::BF16($d), Tensor::BF16($u)) => {
                let $f = combiner::<half::bf16>($red);
                Tensor::BF16($body?)
            }
            (Tensor::I8($d), Tensor::I8($u)) => {
                let $f = combiner::<i8>($red);
                Tensor::I8($body?)
            }
            (Tensor::I16($d), Tensor::I16($u)) => {
                let $f = combiner::<i16>($red);
                Tensor::I16($body?)
            }
            (Tensor::I32($d), Tensor::I32($u)) => {
                let $f = combiner::<i32>($red);
                Tensor::I32($body?)
            }
            (Tensor::I64($d), Tensor::I64($u)) => {
                let $f = combiner::<i64>($red);
                Tensor::I64($body?)
            }
            (Tensor::U8($d), Tensor::U8($u)) => {
                let $f = combiner::<u8>($red);
                Tensor::U8($body?)
            }
            (Tensor::U16($d), Tensor::U16($u)) => {
                let $f = combiner::<u16>($red);
                Tensor::U16($body?)
            }
            (Tensor::U32($d), Tensor::U32($u)) => {
                let $f = combiner::<u32>($red);
                Tensor::U32($body?)
            }
            (Tensor::U64($d), Tensor::U64($u)) => {
                let $f = combiner::<u64>($red);
                Tensor::U64($body?)
            }
            (Tensor::Bool($d), Tensor::Bool($u)) => {
                op_ensure!($red == Reduction::None, "reduction '{}' is not supported for bool tensors", $red.name());
                let $f: fn(bool, bool) -> bool = |_, u| u;
                Tensor::Bool($body?)
            }
            (d, u) => op_bail!("updates are {} but data is {}", u.dtype(), d.dtype()),
        }
    };
}

fn check_index_dtype(dtype: DType, allowed: &[DType], what: &str) -> OpResult<()> {
    op_ensure!(allowed.contains(&dtype), "input '{what}' must be one of {allowed:?}, found {dtype}");
    Ok(())
}

/// Two dims that must be equal: fails only when both are known and differ.
fn check_same_dim(a: &Dim, b: &Dim, what: impl FnOnce() -> String) -> OpResult<()> {
    if let (Some(x), Some(y)) = (a.as_known(), b.as_known()) {
        op_ensure!(x == y, "{}", what());
    }
    Ok(())
}

/// The length `m` of the index tuples (the last dim of `indices`), which must be known.
fn tuple_len(op: &str, indices: &Fact) -> OpResult<usize> {
    op_ensure!(indices.rank() >= 1, "{op}: indices must have rank >= 1, found a scalar");
    let last = &indices.shape()[indices.rank() - 1];
    match last.as_known() {
        Some(m) if m >= 0 => Ok(m as usize),
        _ => op_bail!(
            "{op}: the last dim of indices {} (the index tuple length) must be known at compile time",
            fmt_shape(indices.shape())
        ),
    }
}

/// The reductions an opset allows: none before 16, add/mul from 16, max/min from 18.
fn parse_reduction(ctx: &NodeCtx) -> OpResult<Reduction> {
    let allowed: &[&str] = match ctx.opset {
        ..=15 => &["none"],
        16..=17 => &["none", "add", "mul"],
        _ => &["none", "add", "mul", "max", "min"],
    };
    Ok(match ctx.choice("reduction", "none", allowed)?.as_str() {
        "add" => Reduction::Add,
        "mul" => Reduction::Mul,
        "max" => Reduction::Max,
        "min" => Reduction::Min,
        _ => Reduction::None,
    })
}

// ---------------------------------------------------------------------------------------------
// GatherND

#[derive(Clone, Debug)]
pub struct GatherNd {
    pub batch_dims: usize,
}

impl GatherNd {
    /// Validates ranks and returns the tuple length `m`.
    fn check(&self, data: &[Dim], indices: &Fact) -> OpResult<usize> {
        check_index_dtype(indices.dtype(), &[DType::I64], "indices")?;
        let m = tuple_len("GatherND", indices)?;
        let (r, q, b) = (data.len(), indices.rank(), self.batch_dims);
        op_ensure!(r >= 1, "GatherND: data must have rank >= 1, found a scalar");
        op_ensure!(
            b < q && b < r,
            "GatherND: batch_dims {b} must be less than the ranks of data {} and indices {}",
            fmt_shape(data),
            fmt_shape(indices.shape())
        );
        op_ensure!(
            (1..=r - b).contains(&m),
            "GatherND: index tuples of length {m} (last dim of indices {}) must have 1 to {} entries for data {} with batch_dims {b}",
            fmt_shape(indices.shape()),
            r - b,
            fmt_shape(data)
        );
        for i in 0..b {
            check_same_dim(&data[i], &indices.shape()[i], || {
                format!(
                    "GatherND: batch dim {i} differs between data {} and indices {}",
                    fmt_shape(data),
                    fmt_shape(indices.shape())
                )
            })?;
        }
        Ok(m)
    }
}

impl Op for GatherNd {
    fn op_type(&self) -> &'static str {
        "GatherND"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        let idx = required(inputs, 1, "indices")?;
        let m = self.check(x.shape(), idx)?;
        let mut shape = idx.shape()[..idx.rank() - 1].to_vec();
        shape.extend_from_slice(&x.shape()[self.batch_dims + m..]);
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let idx = required(inputs, 1, "indices")?;
        let idx_fact = Fact::new(idx.dtype(), crate::ir::dim::dims_of(idx.shape()));
        let x_dims = crate::ir::dim::dims_of(x.shape());
        self.check(&x_dims, &idx_fact)?;
        let (xs, is) = (x.shape(), idx.shape());
        op_ensure!(
            xs[..self.batch_dims] == is[..self.batch_dims],
            "GatherND: batch dims of data {xs:?} and indices {is:?} differ"
        );
        let values = idx.to_i64_vec();
        Ok(vec![crate::map_tensor!(x, a => kernels::gather_nd(a, &values, is, self.batch_dims)?)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// GatherND: `out[i..., j...] = data[batch..., indices[i...]..., j...]`.
/// Opset history: 11 introduced it; 12 added `batch_dims` (read at every opset: a model written
/// for 11 cannot carry it); 13 added bfloat16. Negative indices count from the end.
fn parse_gather_nd(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let b = ctx.int_or("batch_dims", 0)?;
    op_ensure!(b >= 0, "attribute 'batch_dims' = {b} must be non-negative");
    Ok(Box::new(GatherNd { batch_dims: b as usize }))
}

// ---------------------------------------------------------------------------------------------
// ScatterND

#[derive(Clone, Debug)]
pub struct ScatterNd {
    pub reduction: Reduction,
}

fn check_scatter_nd(data: &Fact, indices: &Fact, updates: &Fact) -> OpResult<()> {
    check_index_dtype(indices.dtype(), &[DType::I64], "indices")?;
    op_ensure!(
        updates.dtype() == data.dtype(),
        "ScatterND: updates are {} but data is {}",
        updates.dtype(),
        data.dtype()
    );
    let m = tuple_len("ScatterND", indices)?;
    let (r, q) = (data.rank(), indices.rank());
    op_ensure!(r >= 1, "ScatterND: data must have rank >= 1, found a scalar");
    op_ensure!(
        (1..=r).contains(&m),
        "ScatterND: index tuples of length {m} (last dim of indices {}) must have 1 to {r} entries for data {}",
        fmt_shape(indices.shape()),
        fmt_shape(data.shape())
    );
    let mut want = indices.shape()[..q - 1].to_vec();
    want.extend_from_slice(&data.shape()[m..]);
    let mismatch = || {
        format!(
            "ScatterND: updates {} must have shape {} (indices {} without the last dim, then data {} from dim {m})",
            fmt_shape(updates.shape()),
            fmt_shape(&want),
            fmt_shape(indices.shape()),
            fmt_shape(data.shape())
        )
    };
    op_ensure!(updates.rank() == want.len(), "{}", mismatch());
    for (u, w) in updates.shape().iter().zip(&want) {
        check_same_dim(u, w, mismatch)?;
    }
    Ok(())
}

fn known_fact(t: &Tensor) -> Fact {
    Fact::new(t.dtype(), crate::ir::dim::dims_of(t.shape()))
}

impl Op for ScatterNd {
    fn op_type(&self) -> &'static str {
        "ScatterND"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        let idx = required(inputs, 1, "indices")?;
        let upd = required(inputs, 2, "updates")?;
        check_scatter_nd(x, idx, upd)?;
        Ok(vec![Fact::of_type(x.ty.clone())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let idx = required(inputs, 1, "indices")?;
        let upd = required(inputs, 2, "updates")?;
        check_scatter_nd(&known_fact(x), &known_fact(idx), &known_fact(upd))?;
        let values = idx.to_i64_vec();
        let out =
            with_scatter_types!(x, upd, self.reduction, |d, u, f| kernels::scatter_nd(d, &values, idx.shape(), u, f));
        Ok(vec![out])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// ScatterND: a copy of `data` with the slices addressed by the index tuples replaced by (or,
/// with `reduction`, combined with) `updates`.
/// Opset history: 11 introduced it; 13 added bfloat16; 16 added `reduction` none/add/mul; 18
/// added max/min. A reduction the node's opset does not define is rejected.
fn parse_scatter_nd(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(ScatterNd { reduction: parse_reduction(ctx)? }))
}

// ---------------------------------------------------------------------------------------------
// ScatterElements / Scatter

#[derive(Clone, Debug)]
pub struct ScatterElements {
    pub axis: i64,
    pub reduction: Reduction,
    /// Parsed from the deprecated `Scatter` op type (reported back as such).
    pub legacy_name: bool,
}

impl ScatterElements {
    fn name(&self) -> &'static str {
        if self.legacy_name {
            "Scatter"
        } else {
            "ScatterElements"
        }
    }

    fn check(&self, data: &Fact, indices: &Fact, updates: &Fact) -> OpResult<usize> {
        let op = self.name();
        check_index_dtype(indices.dtype(), &[DType::I32, DType::I64], "indices")?;
        op_ensure!(
            updates.dtype() == data.dtype(),
            "{op}: updates are {} but data is {}",
            updates.dtype(),
            data.dtype()
        );
        op_ensure!(data.rank() >= 1, "{op}: data must have rank >= 1, found a scalar");
        op_ensure!(
            indices.rank() == data.rank() && updates.rank() == data.rank(),
            "{op}: data {}, indices {} and updates {} must have the same rank",
            fmt_shape(data.shape()),
            fmt_shape(indices.shape()),
            fmt_shape(updates.shape())
        );
        let axis = normalize_axis(self.axis, data.rank())?;
        for (j, (i, u)) in indices.shape().iter().zip(updates.shape()).enumerate() {
            check_same_dim(i, u, || {
                format!(
                    "{op}: indices {} and updates {} differ in shape",
                    fmt_shape(indices.shape()),
                    fmt_shape(updates.shape())
                )
            })?;
            if j != axis {
                if let (Some(iv), Some(dv)) = (i.as_known(), data.shape()[j].as_known()) {
                    op_ensure!(
                        iv <= dv,
                        "{op}: indices {} exceed data {} on axis {j}",
                        fmt_shape(indices.shape()),
                        fmt_shape(data.shape())
                    );
                }
            }
        }
        Ok(axis)
    }
}

impl Op for ScatterElements {
    fn op_type(&self) -> &'static str {
        self.name()
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        let idx = required(inputs, 1, "indices")?;
        let upd = required(inputs, 2, "updates")?;
        self.check(x, idx, upd)?;
        Ok(vec![Fact::of_type(x.ty.clone())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let idx = required(inputs, 1, "indices")?;
        let upd = required(inputs, 2, "updates")?;
        let axis = self.check(&known_fact(x), &known_fact(idx), &known_fact(upd))?;
        let values = idx.to_i64_vec();
        let out = with_scatter_types!(x, upd, self.reduction, |d, u, f| kernels::scatter_elements(
            d,
            axis,
            &values,
            idx.shape(),
            u,
            f
        ));
        Ok(vec![out])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// ScatterElements: `out = data` with `out[i with axis := indices[i]] = updates[i]` (or combined
/// by `reduction`). Opset history: 11 introduced it (replacing Scatter, negative indices
/// allowed); 13 added bfloat16; 16 added `reduction` none/add/mul; 18 added max/min.
fn parse_scatter_elements(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(ScatterElements { axis: ctx.int_or("axis", 0)?, reduction: parse_reduction(ctx)?, legacy_name: false }))
}

/// Scatter: opset 9 name of ScatterElements without `reduction`; deprecated in opset 11 (where
/// it is an exact alias of ScatterElements-11). Negative indices, only defined from 11, are
/// accepted at every opset as ONNX Runtime does.
fn parse_scatter(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    op_ensure!(
        !ctx.has("reduction"),
        "attribute 'reduction' is not defined for Scatter (use ScatterElements, opset 16+)"
    );
    Ok(Box::new(ScatterElements { axis: ctx.int_or("axis", 0)?, reduction: Reduction::None, legacy_name: true }))
}

// ---------------------------------------------------------------------------------------------
// OneHot

#[derive(Clone, Debug)]
pub struct OneHot {
    pub axis: i64,
}

/// The depth from a one-element numeric tensor (float depths are truncated, as ONNX Runtime does).
fn depth_of(t: &Tensor) -> OpResult<usize> {
    op_ensure!(t.len() == 1, "OneHot: 'depth' must hold exactly one value, found shape {:?}", t.shape());
    let d = t.to_f64_vec()[0];
    op_ensure!(d.is_finite() && d >= 1.0, "OneHot: 'depth' must be at least 1, found {d}");
    Ok(d as usize)
}

impl OneHot {
    fn check(&self, indices: &Fact, depth: &Fact, values: &Fact) -> OpResult<usize> {
        op_ensure!(indices.dtype() != DType::Bool, "OneHot: indices must be numeric, found bool");
        op_ensure!(depth.dtype() != DType::Bool, "OneHot: depth must be numeric, found bool");
        op_ensure!(
            depth.rank() <= 1,
            "OneHot: depth must be a scalar or a one-element tensor, found {}",
            fmt_shape(depth.shape())
        );
        op_ensure!(
            values.rank() == 1,
            "OneHot: values must be a rank-1 tensor [off, on], found {}",
            fmt_shape(values.shape())
        );
        check_same_dim(&values.shape()[0], &Dim::known(2), || {
            format!("OneHot: values must hold 2 values [off, on], found {}", fmt_shape(values.shape()))
        })?;
        normalize_axis(self.axis, indices.rank() + 1)
    }
}

impl Op for OneHot {
    fn op_type(&self) -> &'static str {
        "OneHot"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let idx = required(inputs, 0, "indices")?;
        let depth = required(inputs, 1, "depth")?;
        let values = required(inputs, 2, "values")?;
        let axis = self.check(idx, depth, values)?;
        let d = match &depth.konst {
            Some(t) => Dim::from(depth_of(t)?),
            // A shape expression (e.g. a dim read through Shape) keeps its symbol; any other
            // run-time depth makes the new axis data-dependent.
            None => match depth.as_dims().as_deref() {
                Some([d]) => {
                    if let Some(v) = d.as_known() {
                        op_ensure!(v >= 1, "OneHot: 'depth' must be at least 1, found {v}");
                    }
                    d.clone()
                }
                _ => Dim::data_dependent(),
            },
        };
        let mut shape = idx.shape().to_vec();
        shape.insert(axis, d);
        Ok(vec![Fact::new(values.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let idx = required(inputs, 0, "indices")?;
        let depth_t = required(inputs, 1, "depth")?;
        let values = required(inputs, 2, "values")?;
        let axis = self.check(&known_fact(idx), &known_fact(depth_t), &known_fact(values))?;
        let depth = depth_of(depth_t)?;
        let ids = idx.to_i64_vec();
        fn go<T: Elem>(
            v: &ndarray::ArrayD<T>,
            ids: &[i64],
            shape: &[usize],
            depth: usize,
            axis: usize,
            wraps: bool,
        ) -> OpResult<Tensor> {
            let (off, on) = (v[[0]], v[[1]]);
            Ok(T::wrap(kernels::one_hot(ids, shape, depth, axis, off, on, wraps)?))
        }
        let out = crate::with_tensor!(values, v => go(v, &ids, idx.shape(), depth, axis, true)?);
        Ok(vec![out])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// OneHot: inserts a `depth`-long axis at `axis` (default -1, i.e. last) that is `values[1]` at
/// the index and `values[0]` elsewhere. `depth` sets the output shape: a constant or a shape
/// expression gives a static or symbolic dim; a run-time depth (e.g. a graph input, as in the
/// ONNX backend tests) gives a data-dependent dim, bound when the reference executor runs and
/// rejected by code generation. Opset history: 9 introduced it (indices documented in `[0, depth)`);
/// 11 defines negative indices in `[-depth, 0)` as counted from the end and negative `axis`.
/// ONNX Runtime applies the opset 11 rules at opset 9 too (checked: index -1 with depth 4 sets
/// position 3), and so do we; indices outside `[-depth, depth)` select nothing.
fn parse_one_hot(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(OneHot { axis: ctx.int_or("axis", -1)? }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Attr;
    use std::sync::Arc;

    fn parse(op: &str, opset: i64, attrs: &[(&str, Attr)]) -> OpResult<Box<dyn Op>> {
        crate::ir::ops::testutil::parse_node(op, opset, attrs, &[true; 3], 1)
    }

    fn sym(names: &[&str]) -> Vec<Dim> {
        names.iter().map(|s| s.parse::<i64>().map(Dim::known).unwrap_or_else(|_| Dim::sym(*s))).collect()
    }

    fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
        Tensor::from_i64s(shape, v.to_vec())
    }

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32s(shape, v.to_vec())
    }

    fn eval(op: &dyn Op, inputs: &[&Tensor]) -> OpResult<Tensor> {
        let args: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        Ok(op.eval(&args)?.remove(0))
    }

    #[test]
    fn gather_nd_infer_keeps_symbols() {
        let op = parse("GatherND", 13, &[("batch_dims", Attr::Int(1))]).unwrap();
        let x = Fact::new(DType::F32, sym(&["N", "S", "4", "8"]));
        let idx = Fact::new(DType::I64, sym(&["N", "K", "2"]));
        let out = op.infer(&[Some(&x), Some(&idx)]).unwrap();
        assert_eq!(out[0].shape(), sym(&["N", "K", "8"]).as_slice());
        let bad = Fact::new(DType::I64, sym(&["N", "T"]));
        let err = op.infer(&[Some(&x), Some(&bad)]).unwrap_err();
        assert!(err.0.contains("must be known at compile time"), "{}", err.0);
        let too_long = Fact::new(DType::I64, sym(&["N", "4"]));
        assert!(op.infer(&[Some(&x), Some(&too_long)]).unwrap_err().0.contains("1 to 3 entries"));
    }

    #[test]
    fn gather_nd_matches_ort() {
        // ORT: data = arange(24).reshape(2,3,4) float, indices [[[0,1],[2,-1]],[[1,0],[0,3]]],
        // batch_dims=1 -> [[1,11],[16,15]]
        let op = parse("GatherND", 13, &[("batch_dims", Attr::Int(1))]).unwrap();
        let x = f32s(&[2, 3, 4], &(0..24).map(|v| v as f32).collect::<Vec<_>>());
        let idx = i64s(&[2, 2, 2], &[0, 1, 2, -1, 1, 0, 0, 3]);
        let y = eval(op.as_ref(), &[&x, &idx]).unwrap();
        assert_eq!(y.shape(), &[2, 2]);
        assert_eq!(y.to_f64_vec(), vec![1.0, 11.0, 16.0, 15.0]);
        // batch_dims=0, tuple of length 1 picks whole rows: indices [[1],[0]] -> data[1], data[0].
        let op0 = parse("GatherND", 11, &[]).unwrap();
        let y0 = eval(op0.as_ref(), &[&x, &i64s(&[2, 1], &[1, 0])]).unwrap();
        assert_eq!(y0.shape(), &[2, 3, 4]);
        assert_eq!(y0.to_f64_vec()[0], 12.0);
        assert!(eval(op0.as_ref(), &[&x, &i64s(&[1, 1], &[2])]).unwrap_err().0.contains("out of range"));
    }

    #[test]
    fn scatter_nd_reductions_match_ort() {
        // ORT opset 18: data = arange(8).reshape(2,4) float, indices [[0,1],[1,3],[0,1]],
        // updates [10,20,30]: none -> last duplicate wins.
        let x = f32s(&[2, 4], &(0..8).map(|v| v as f32).collect::<Vec<_>>());
        let idx = i64s(&[3, 2], &[0, 1, 1, 3, 0, 1]);
        let upd = f32s(&[3], &[10.0, 20.0, 30.0]);
        let none = parse("ScatterND", 18, &[]).unwrap();
        assert_eq!(
            eval(none.as_ref(), &[&x, &idx, &upd]).unwrap().to_f64_vec(),
            vec![0.0, 30.0, 2.0, 3.0, 4.0, 5.0, 6.0, 20.0]
        );
        let add = parse("ScatterND", 16, &[("reduction", Attr::String("add".into()))]).unwrap();
        assert_eq!(
            eval(add.as_ref(), &[&x, &idx, &upd]).unwrap().to_f64_vec(),
            vec![0.0, 41.0, 2.0, 3.0, 4.0, 5.0, 6.0, 27.0]
        );
        let mul = parse("ScatterND", 18, &[("reduction", Attr::String("mul".into()))]).unwrap();
        assert_eq!(
            eval(mul.as_ref(), &[&x, &idx, &upd]).unwrap().to_f64_vec(),
            vec![0.0, 300.0, 2.0, 3.0, 4.0, 5.0, 6.0, 140.0]
        );
        let min = parse("ScatterND", 18, &[("reduction", Attr::String("min".into()))]).unwrap();
        assert_eq!(
            eval(min.as_ref(), &[&x, &idx, &upd]).unwrap().to_f64_vec(),
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
        );
        // Row slices: indices [[1]] replaces row 1; int64 data stays exact.
        let xi = i64s(&[2, 2], &[1 << 60, 1, 2, 3]);
        let yi = eval(none.as_ref(), &[&xi, &i64s(&[1, 1], &[-2]), &i64s(&[1, 2], &[7, 8])]).unwrap();
        assert_eq!(yi.to_i64_vec(), vec![7, 8, 2, 3]);
        // Opset gating and shape errors.
        let err = parse("ScatterND", 16, &[("reduction", Attr::String("max".into()))]).unwrap_err();
        assert!(err.0.contains("not supported"), "{}", err.0);
        let bad = Fact::new(DType::F32, sym(&["2"]));
        let e = none.infer(&[Some(&known_fact(&x)), Some(&known_fact(&idx)), Some(&bad)]).unwrap_err();
        assert!(e.0.contains("must have shape [3]"), "{}", e.0);
        let bool_add = eval(add.as_ref(), &[&x.cast(DType::Bool), &idx, &upd.cast(DType::Bool)]).unwrap_err();
        assert!(bool_add.0.contains("not supported for bool"), "{}", bool_add.0);
    }

    #[test]
    fn scatter_elements_matches_ort() {
        // ORT opset 18: data = zeros(3,3), indices [[1,0,2],[0,2,1]], updates
        // [[1,1.1,1.2],[2,2.1,2.2]], axis 0 -> [[2,1.1,0],[1,0,2.2],[0,2.1,1.2]]
        let x = f32s(&[3, 3], &[0.0; 9]);
        let idx = i64s(&[2, 3], &[1, 0, 2, 0, 2, 1]);
        let upd = f32s(&[2, 3], &[1.0, 1.1, 1.2, 2.0, 2.1, 2.2]);
        let op = parse("ScatterElements", 11, &[]).unwrap();
        let y = eval(op.as_ref(), &[&x, &idx, &upd]).unwrap();
        let want = [2.0, 1.1, 0.0, 1.0, 0.0, 2.2, 0.0, 2.1, 1.2];
        for (a, b) in y.to_f64_vec().iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{y:?}");
        }
        // axis=-1 with max: data [[1,5,3]], indices [[0,0,2]], updates [[4,2,1]] -> [[4,5,3]]
        let op = parse("ScatterElements", 18, &[("axis", Attr::Int(-1)), ("reduction", Attr::String("max".into()))])
            .unwrap();
        let y = eval(
            op.as_ref(),
            &[&i64s(&[1, 3], &[1, 5, 3]), &i64s(&[1, 3], &[0, 0, 2]).cast(DType::I32), &i64s(&[1, 3], &[4, 2, 1])],
        )
        .unwrap();
        assert_eq!(y.to_i64_vec(), vec![4, 5, 3]);
        // Scatter (opset 9) is the same op.
        let legacy = parse("Scatter", 9, &[("axis", Attr::Int(1))]).unwrap();
        assert_eq!(legacy.op_type(), "Scatter");
        let y =
            eval(legacy.as_ref(), &[&f32s(&[1, 3], &[1.0, 2.0, 3.0]), &i64s(&[1, 1], &[2]), &f32s(&[1, 1], &[9.0])])
                .unwrap();
        assert_eq!(y.to_f64_vec(), vec![1.0, 2.0, 9.0]);
        let oob =
            eval(legacy.as_ref(), &[&f32s(&[1, 3], &[1.0, 2.0, 3.0]), &i64s(&[1, 1], &[3]), &f32s(&[1, 1], &[9.0])])
                .unwrap_err();
        assert!(oob.0.contains("index 3 is out of range for axis 1"), "{}", oob.0);
        let sym_x = Fact::new(DType::F32, sym(&["N", "8"]));
        let sym_i = Fact::new(DType::I64, sym(&["N", "2"]));
        assert_eq!(
            legacy.infer(&[Some(&sym_x), Some(&sym_i), Some(&Fact::new(DType::F32, sym(&["N", "2"])))]).unwrap()[0].ty,
            sym_x.ty
        );
    }

    #[test]
    fn one_hot_matches_ort() {
        // ORT opset 11: indices [[0,-1],[5,2]] (int64), depth 4 (float), values [2,7] int32,
        // axis 1 -> shape [2,4,2]: [[[7,2],[2,2],[2,2],[2,7]], [[2,2],[2,2],[2,7],[2,2]]]
        let op = parse("OneHot", 11, &[("axis", Attr::Int(1))]).unwrap();
        let idx = i64s(&[2, 2], &[0, -1, 5, 2]);
        let depth = Tensor::from_f32s(&[], vec![4.0]);
        let values = i64s(&[2], &[2, 7]).cast(DType::I32);
        let y = eval(op.as_ref(), &[&idx, &depth, &values]).unwrap();
        assert_eq!(y.dtype(), DType::I32);
        assert_eq!(y.shape(), &[2, 4, 2]);
        assert_eq!(y.to_i64_vec(), vec![7, 2, 2, 2, 2, 2, 2, 7, 2, 2, 2, 2, 2, 7, 2, 2]);
        // Infer: depth constant, symbolic batch dim kept, default axis last.
        let last = parse("OneHot", 9, &[]).unwrap();
        let idx_f = Fact::new(DType::I64, sym(&["N", "S"]));
        let depth_f = Fact::constant(Arc::new(depth.clone()));
        let out = last.infer(&[Some(&idx_f), Some(&depth_f), Some(&known_fact(&values))]).unwrap();
        assert_eq!(out[0].shape(), sym(&["N", "S", "4"]).as_slice());
        let runtime_depth = Fact::new(DType::I64, vec![]);
        let out = last.infer(&[Some(&idx_f), Some(&runtime_depth), Some(&known_fact(&values))]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::sym("N"), Dim::sym("S"), Dim::data_dependent()]);
        let shape_depth = Fact::symbolic(vec![Dim::sym("C")], true);
        let out = last.infer(&[Some(&idx_f), Some(&shape_depth), Some(&known_fact(&values))]).unwrap();
        assert_eq!(out[0].shape(), sym(&["N", "S", "C"]).as_slice());
        let zero = Fact::constant(Arc::new(i64s(&[1], &[0])));
        assert!(last
            .infer(&[Some(&idx_f), Some(&zero), Some(&known_fact(&values))])
            .unwrap_err()
            .0
            .contains("at least 1"));
    }
}
