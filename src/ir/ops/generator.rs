//! The generator op family: ops whose output is made from attributes and shapes rather than
//! from input elements (Constant, ConstantOfShape, Range, EyeLike).
//!
//! ConstantOfShape and Range read their shape-like inputs through `Fact::as_dims`, so a mask of
//! `ConstantOfShape(Shape(x))` has the symbolic type `[N, S]` and `Range(0, S, 1)` has `[S]`.

use super::shape::{fact_with_sym, runtime_dims_input, sym_values, tensor_ints, MAX_SYM_LEN};
use super::OpSpec;
use crate::ir::dim::fmt_shape;
use crate::ir::{required, DType, Dim, Fact, NodeCtx, Op, OpError, OpResult, Tensor};
use crate::reference::indexing as kernels;
use crate::{op_bail, op_ensure};
use std::any::Any;
use std::sync::Arc;

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("Constant", parse_constant),
    OpSpec::onnx("ConstantOfShape", parse_constant_of_shape),
    OpSpec::onnx("Range", parse_range),
    OpSpec::onnx("EyeLike", parse_eye_like),
];

// ---------------------------------------------------------------------------------------------
// Constant

#[derive(Clone, Debug)]
pub struct Constant {
    pub value: Arc<Tensor>,
}

impl Op for Constant {
    fn op_type(&self) -> &'static str {
        "Constant"
    }

    fn infer(&self, _inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        Ok(vec![Fact::constant(self.value.clone())])
    }

    fn eval(&self, _inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        Ok(vec![(*self.value).clone()])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The attributes a Constant node may carry its value in; exactly one must be set.
const CONSTANT_VALUE_ATTRS: &[&str] = &[
    "value",
    "value_float",
    "value_floats",
    "value_int",
    "value_ints",
    "value_string",
    "value_strings",
    "sparse_value",
];

/// Constant. Opset 1: `value` (a tensor). Opset 11: adds `sparse_value`. Opset 12: adds
/// `value_float(s)`, `value_int(s)` and `value_string(s)`. Exactly one of them must be set.
/// Scalars (`value_float`, `value_int`) give 0-D tensors, lists 1-D ones; string and sparse
/// values are rejected because onnx2ait holds neither string tensors nor sparse ones.
fn parse_constant(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let set: Vec<&str> = CONSTANT_VALUE_ATTRS.iter().copied().filter(|a| ctx.has(a)).collect();
    let which = match set.as_slice() {
        [one] => *one,
        [] => op_bail!("no value attribute (expected exactly one of {CONSTANT_VALUE_ATTRS:?})"),
        many => op_bail!("several value attributes {many:?} (expected exactly one)"),
    };
    let value = match which {
        "value" => ctx.req_tensor("value")?,
        "value_float" => Tensor::from_f32s(&[], vec![ctx.req_float("value_float")?]),
        "value_floats" => {
            let v = ctx.req_floats("value_floats")?;
            Tensor::from_f32s(&[v.len()], v)
        }
        "value_int" => Tensor::from_i64s(&[], vec![ctx.req_int("value_int")?]),
        "value_ints" => {
            let v = ctx.req_ints("value_ints")?;
            Tensor::from_i64s(&[v.len()], v)
        }
        "value_string" | "value_strings" => {
            op_bail!("attribute '{which}': string constants are not supported (onnx2ait has no string tensors)")
        }
        _ => op_bail!("attribute '{which}': sparse constants are not supported; store the tensor densely"),
    };
    Ok(Box::new(Constant { value: Arc::new(value) }))
}

// ---------------------------------------------------------------------------------------------
// ConstantOfShape

#[derive(Clone, Debug)]
pub struct ConstantOfShape {
    /// One-element tensor giving the fill value and the output dtype.
    pub value: Tensor,
}

impl Op for ConstantOfShape {
    fn op_type(&self) -> &'static str {
        "ConstantOfShape"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let shape_in = required(inputs, 0, "input")?;
        op_ensure!(shape_in.rank() == 1, "input 'input' must be 1-D, found shape {}", fmt_shape(shape_in.shape()));
        let shape = runtime_dims_input(shape_in, "input")?;
        if let Some(d) = shape.iter().find(|d| d.as_known().is_some_and(|v| v < 0)) {
            op_bail!("shape {} contains the negative dim {d}", fmt_shape(&shape));
        }
        let dtype = self.value.dtype();
        // A filled shape tensor (e.g. `ConstantOfShape([k]) of 1` feeding Mul/Where in PyTorch
        // exports) keeps its contents when its length is known.
        let fill = self.value.to_i64_vec().first().copied().map(Dim::known);
        let sym = match (shape.as_slice(), fill) {
            ([], Some(v)) => Some(vec![v]),
            ([n], Some(v)) => n.as_known().filter(|&n| n <= MAX_SYM_LEN).map(|n| vec![v; n as usize]),
            _ => None,
        };
        Ok(vec![fact_with_sym(dtype, shape, sym.filter(|_| dtype.is_int()))])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let shape = tensor_ints(required(inputs, 0, "input")?, "input")?;
        let shape: Vec<usize> = shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| OpError(format!("shape {shape:?} contains a negative dim"))))
            .collect::<OpResult<_>>()?;
        Ok(vec![kernels::fill(&self.value, &shape)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// ConstantOfShape (opset 9; 20 and 21 only widened the value types): a tensor of the shape
/// given by the 1-D int64 input, filled with the one-element `value` attribute (default float32
/// 0). An empty shape gives a 0-D tensor. The shape is read through `as_dims`, so it may be
/// symbolic; a shape only known at run time (of static length) gives data-dependent dims.
fn parse_constant_of_shape(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let value = match ctx.tensor("value")? {
        Some(t) => {
            op_ensure!(t.len() == 1, "attribute 'value' must hold exactly one element, found shape {:?}", t.shape());
            t
        }
        None => Tensor::from_f32s(&[1], vec![0.0]),
    };
    Ok(Box::new(ConstantOfShape { value }))
}

// ---------------------------------------------------------------------------------------------
// Range

#[derive(Clone, Debug)]
pub struct Range;

const RANGE_INPUTS: [&str; 3] = ["start", "limit", "delta"];

/// Element count of an integer Range over (possibly symbolic) bounds.
fn range_len_dims(start: &Dim, limit: &Dim, delta: i64) -> OpResult<Dim> {
    op_ensure!(delta != 0, "'delta' must not be zero");
    let len = if delta > 0 {
        limit.sub(start).div_ceil(&Dim::known(delta))
    } else {
        start.sub(limit).div_ceil(&Dim::known(delta.saturating_neg()))
    };
    Ok(match len.as_known() {
        Some(n) => Dim::known(n.max(0)),
        None => len,
    })
}

impl Op for Range {
    fn op_type(&self) -> &'static str {
        "Range"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let facts: Vec<&Fact> = (0..3).map(|i| required(inputs, i, RANGE_INPUTS[i])).collect::<OpResult<_>>()?;
        let dtype = facts[0].dtype();
        for (i, f) in facts.iter().enumerate() {
            op_ensure!(f.dtype() == dtype, "'{}' is {}, 'start' is {dtype}", RANGE_INPUTS[i], f.dtype());
            op_ensure!(
                f.rank() == 0 || f.shape() == [Dim::known(1)],
                "'{}' must be a scalar, found shape {}",
                RANGE_INPUTS[i],
                fmt_shape(f.shape())
            );
        }
        op_ensure!(
            matches!(dtype, DType::F32 | DType::F64 | DType::I16 | DType::I32 | DType::I64),
            "Range of {dtype} is not supported (float, double, int16, int32 or int64 are)"
        );
        // A zero step is an error whether or not the bounds are known.
        op_ensure!(facts[2].konst.as_ref().and_then(|k| k.scalar_f64()) != Some(0.0), "'delta' must not be zero");
        // Bounds only known at run time make the length data-dependent.
        let runtime = || Ok(vec![Fact::new(dtype, vec![Dim::data_dependent()])]);
        if dtype.is_float() {
            let vals: Option<Vec<f64>> = facts.iter().map(|f| f.konst.as_ref().and_then(|k| k.scalar_f64())).collect();
            let Some(vals) = vals else { return runtime() };
            let n = kernels::range_len_f64(vals[0], vals[1], vals[2])?;
            return Ok(vec![Fact::new(dtype, vec![Dim::from(n)])]);
        }
        let dims: Option<Vec<Dim>> = facts.iter().map(|f| sym_values(f).and_then(|v| v.into_iter().next())).collect();
        let Some(dims) = dims else { return runtime() };
        // A symbolic delta cannot give a length polynomial (its sign decides the formula).
        let Some(delta) = dims[2].as_known() else {
            return runtime();
        };
        let len = range_len_dims(&dims[0], &dims[1], delta)?;
        // `Range(S-1, -1, -1)` and friends over symbolic bounds keep their values.
        let sym = len
            .as_known()
            .filter(|&n| n <= MAX_SYM_LEN)
            .map(|n| (0..n).map(|i| dims[0].add(&Dim::known(i * delta))).collect());
        Ok(vec![fact_with_sym(dtype, vec![len], sym)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let ts: Vec<&Tensor> = (0..3).map(|i| required(inputs, i, RANGE_INPUTS[i])).collect::<OpResult<_>>()?;
        let dtype = ts[0].dtype();
        for (i, t) in ts.iter().enumerate() {
            op_ensure!(t.dtype() == dtype, "'{}' is {}, 'start' is {dtype}", RANGE_INPUTS[i], t.dtype());
            op_ensure!(t.len() == 1, "'{}' must be a scalar, found shape {:?}", RANGE_INPUTS[i], t.shape());
        }
        Ok(vec![match dtype {
            DType::F32 => {
                let v: Vec<f32> = ts.iter().map(|t| t.to_f32().iter().copied().next().unwrap_or_default()).collect();
                let out = kernels::range_f32(v[0], v[1], v[2])?;
                Tensor::from_f32s(&[out.len()], out)
            }
            DType::F64 => {
                let v: Vec<f64> = ts.iter().map(|t| t.to_f64_vec()[0]).collect();
                let out = kernels::range_f64(v[0], v[1], v[2])?;
                Tensor::F64(
                    ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[out.len()]), out)
                        .map_err(|e| OpError(format!("internal: {e}")))?,
                )
            }
            DType::I16 | DType::I32 | DType::I64 => {
                let v: Vec<i64> = ts.iter().map(|t| t.to_i64_vec()[0]).collect();
                let out = kernels::range_i64(v[0], v[1], v[2])?;
                Tensor::from_i64s(&[out.len()], out).cast(dtype)
            }
            other => op_bail!("Range of {other} is not supported (float, double, int16, int32 or int64 are)"),
        }])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Range (opset 11): `start, start+delta, ...` up to `limit` (exclusive), length
/// `max(ceil((limit-start)/delta), 0)`. Integer bounds may be symbolic (`Range(0, S, 1)` has
/// type `[S]`, with a known `delta`); float bounds give a static length when constant. Bounds
/// only known at run time (or a symbolic `delta`) give a data-dependent length. Floats
/// accumulate in their own type like ONNX Runtime.
fn parse_range(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(Range))
}

// ---------------------------------------------------------------------------------------------
// EyeLike

#[derive(Clone, Debug)]
pub struct EyeLike {
    /// Output dtype; `None`: the input's.
    pub dtype: Option<DType>,
    pub k: i64,
}

impl Op for EyeLike {
    fn op_type(&self) -> &'static str {
        "EyeLike"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        op_ensure!(x.rank() == 2, "input must be 2-D, found shape {}", fmt_shape(x.shape()));
        Ok(vec![Fact::new(self.dtype.unwrap_or(x.dtype()), x.shape().to_vec())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        op_ensure!(x.rank() == 2, "input must be 2-D, found shape {:?}", x.shape());
        let dtype = self.dtype.unwrap_or(x.dtype());
        Ok(vec![kernels::eye_tensor(dtype, x.shape()[0], x.shape()[1], self.k)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// EyeLike (opset 9; 22 only widened types): a 2-D tensor of the input's shape with ones on
/// the diagonal offset by `k`. The optional `dtype` attribute (an ONNX type code) overrides
/// the input's element type.
fn parse_eye_like(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let dtype = match ctx.int("dtype")? {
        None => None,
        Some(code) => match i32::try_from(code).ok().and_then(DType::from_onnx) {
            Some(d) => Some(d),
            None => op_bail!(
                "attribute 'dtype' = {code} ({}) is not supported",
                i32::try_from(code).map_or("unknown", DType::onnx_code_name)
            ),
        },
    };
    Ok(Box::new(EyeLike { dtype, k: ctx.int_or("k", 0)? }))
}

#[cfg(test)]
mod tests {
    use crate::ir::ops::testutil::*;
    use crate::ir::{Attr, DType, Dim, Fact, Tensor};
    use std::sync::Arc;

    #[test]
    fn constant_value_attributes() {
        let t = Tensor::from_f32s(&[2], vec![1.5, 2.5]);
        let c = parse("Constant", 13, vec![("value", Attr::Tensor(t.clone()))], 0, 1).unwrap();
        let f = c.infer(&[]).unwrap();
        assert_eq!(f[0].konst.as_deref(), Some(&t));
        assert_eq!(eval1(&*c, &[]), t);
        let cases = vec![
            ("value_float", Attr::Float(2.0), DType::F32, 0usize),
            ("value_floats", Attr::Floats(vec![1.0, 2.0, 3.0]), DType::F32, 1),
            ("value_int", Attr::Int(7), DType::I64, 0),
            ("value_ints", Attr::Ints(vec![1, -1]), DType::I64, 1),
        ];
        for (name, attr, dtype, rank) in cases {
            let c = parse("Constant", 13, vec![(name, attr)], 0, 1).unwrap();
            let out = eval1(&*c, &[]);
            assert_eq!((out.dtype(), out.rank()), (dtype, rank), "{name}");
        }
        let msg = parse("Constant", 13, vec![("value_string", Attr::String("a".into()))], 0, 1).unwrap_err().0;
        assert!(msg.contains("string constants are not supported"), "{msg}");
        let msg = parse("Constant", 13, vec![("sparse_value", Attr::Other("SPARSE_TENSOR"))], 0, 1).unwrap_err().0;
        assert!(msg.contains("sparse"), "{msg}");
        assert!(parse("Constant", 13, vec![], 0, 1).unwrap_err().0.contains("no value attribute"));
        let two = vec![("value_int", Attr::Int(1)), ("value_float", Attr::Float(1.0))];
        assert!(parse("Constant", 13, two, 0, 1).unwrap_err().0.contains("several"));
    }

    #[test]
    fn constant_of_shape_symbolic_and_values() {
        let default = parse("ConstantOfShape", 13, vec![], 1, 1).unwrap();
        let shape = Fact::symbolic(vec![Dim::sym("N"), Dim::sym("S")], false);
        let out = default.infer(&[Some(&shape)]).unwrap();
        assert_eq!(out[0].dtype(), DType::F32);
        assert_eq!(out[0].shape(), &[Dim::sym("N"), Dim::sym("S")]);
        let z = eval1(&*default, &[&t_ints(&[2, 3])]);
        assert_eq!((z.shape().to_vec(), z.to_f64_vec().iter().sum::<f64>()), (vec![2, 3], 0.0));
        let ones = parse("ConstantOfShape", 13, vec![("value", Attr::Tensor(Tensor::from_i64s(&[1], vec![1])))], 1, 1)
            .unwrap();
        let out = ones.infer(&[Some(&ints(&[3]))]).unwrap();
        assert_eq!(out[0].sym, Some(vec![Dim::known(1); 3]));
        let scalar_out = eval1(&*ones, &[&t_ints(&[])]);
        assert_eq!((scalar_out.rank(), scalar_out.to_i64_vec()), (0, vec![1]));
        let big = Tensor::from_i64s(&[1], vec![i64::MAX - 3]);
        let exact = parse("ConstantOfShape", 13, vec![("value", Attr::Tensor(big))], 1, 1).unwrap();
        assert_eq!(eval1(&*exact, &[&t_ints(&[2])]).to_i64_vec(), vec![i64::MAX - 3; 2]);
        let bad = Tensor::from_f32s(&[2], vec![1.0, 2.0]);
        assert!(parse("ConstantOfShape", 13, vec![("value", Attr::Tensor(bad))], 1, 1).is_err());
        assert!(default.infer(&[Some(&ints(&[2, -1]))]).unwrap_err().0.contains("negative"));
    }

    #[test]
    fn range_lengths_values_and_symbols() {
        let op = parse("Range", 11, vec![], 3, 1).unwrap();
        let s = Fact::symbolic(vec![Dim::sym("S")], true);
        assert_eq!(out_shape(&*op, &[&scalar(0), &s, &scalar(1)]), "[S]");
        assert_eq!(out_shape(&*op, &[&scalar(0), &s, &scalar(2)]), "[ceil(S/2)]");
        let n = Fact::symbolic(vec![Dim::sym("N").add(&Dim::known(3))], true);
        let near = Fact::symbolic(vec![Dim::sym("N")], true);
        let out = op.infer(&[Some(&near), Some(&n), Some(&scalar(1))]).unwrap();
        assert_eq!(out[0].sym.as_ref().map(|v| v.len()), Some(3));
        let i = eval1(
            &*op,
            &[&Tensor::from_i64s(&[], vec![10]), &Tensor::from_i64s(&[], vec![4]), &Tensor::from_i64s(&[], vec![-3])],
        );
        assert_eq!(i.to_i64_vec(), vec![10, 7]);
        // onnxruntime 1.32: Range(0.1, 3.0, 0.3) in float32 accumulates the step.
        let f = |v: f32| Tensor::from_f32s(&[], vec![v]);
        let out = eval1(&*op, &[&f(0.1), &f(3.0), &f(0.3)]);
        let want = [0.1f32, 0.4, 0.70000005, 1.0, 1.3, 1.5999999, 1.8999999, 2.1999998, 2.4999998, 2.7999997];
        let got: Vec<f32> = out.to_f32().iter().copied().collect();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?}");
        }
        let ff = Fact::constant(Arc::new(f(0.0)));
        let lim = Fact::constant(Arc::new(f(1.0)));
        let d = Fact::constant(Arc::new(f(0.25)));
        assert_eq!(out_shape(&*op, &[&ff, &lim, &d]), "[4]");
        // Bounds known only at run time: the length is data-dependent.
        let runtime = fact(DType::F32, "");
        let out = op.infer(&[Some(&ff), Some(&runtime), Some(&d)]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::data_dependent()]);
        let runtime_i = fact(DType::I64, "");
        let out = op.infer(&[Some(&scalar(0)), Some(&runtime_i), Some(&scalar(1))]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::data_dependent()]);
        assert!(op.infer(&[Some(&scalar(0)), Some(&scalar(3)), Some(&scalar(0))]).unwrap_err().0.contains("zero"));
    }

    #[test]
    fn eye_like_offsets_and_dtype() {
        let op = parse("EyeLike", 13, vec![("k", Attr::Int(1)), ("dtype", Attr::Int(7))], 1, 1).unwrap();
        let out = eval1(&*op, &[&iota(&[2, 3])]);
        assert_eq!(out.dtype(), DType::I64);
        assert_eq!(out.to_i64_vec(), vec![0, 1, 0, 0, 0, 1]);
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "N,N")]), "[N,N]");
        assert!(op.infer(&[Some(&fact(DType::F32, "3"))]).is_err());
        assert!(parse("EyeLike", 13, vec![("dtype", Attr::Int(8))], 1, 1).unwrap_err().0.contains("STRING"));
    }

    #[test]
    fn constant_of_shape_with_runtime_shape() {
        let op = parse("ConstantOfShape", 13, vec![("value", Attr::Tensor(Tensor::from_i64s(&[1], vec![7])))], 1, 1)
            .unwrap();
        let out = op.infer(&[Some(&fact(DType::I64, "3"))]).unwrap();
        assert_eq!(out[0].dtype(), DType::I64);
        assert_eq!(out[0].shape(), vec![Dim::data_dependent(); 3].as_slice());
        assert!(out[0].sym.is_none());
        let t = eval1(&*op, &[&t_ints(&[2, 1, 2])]);
        assert_eq!(t.shape(), &[2, 1, 2]);
        assert_eq!(t.to_i64_vec(), vec![7; 4]);
        let msg = op.infer(&[Some(&fact(DType::I64, "R"))]).unwrap_err().0;
        assert!(msg.contains("is not static"), "{msg}");
    }
}
