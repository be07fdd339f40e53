//! The fused elementwise kernel: one expression over broadcast inputs, one pass over memory.

use super::act::Act;
use crate::ir::broadcast::broadcast_shapes;
use crate::ir::{required, Fact, Op, OpResult, Tensor};
use crate::reference::kernel::elementwise as kernels;
use crate::{op_bail, op_ensure};
use std::any::Any;
use std::fmt;

/// A binary pointwise operator (numpy broadcasting).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
}

impl BinOp {
    pub fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::Div => "div",
            BinOp::Pow => "pow",
            BinOp::Max => "max",
            BinOp::Min => "min",
        }
    }

    #[inline]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
            BinOp::Pow => a.powf(b),
            BinOp::Max => a.max(b),
            BinOp::Min => a.min(b),
        }
    }
}

/// An expression tree over the kernel's inputs. Inputs may be read several times
/// (`mul(in0, sigmoid(in0))`); the kernel still loads each input once per element.
#[derive(Clone, Debug, PartialEq)]
pub enum EwExpr {
    Input(usize),
    Unary(Act, Box<EwExpr>),
    Binary(BinOp, Box<EwExpr>, Box<EwExpr>),
}

impl EwExpr {
    /// The largest input index read, plus one.
    pub fn arity(&self) -> usize {
        match self {
            EwExpr::Input(i) => i + 1,
            EwExpr::Unary(_, a) => a.arity(),
            EwExpr::Binary(_, a, b) => a.arity().max(b.arity()),
        }
    }

    /// Pointwise operations per output element (for the cost model).
    pub fn flops(&self) -> f64 {
        match self {
            EwExpr::Input(_) => 0.0,
            EwExpr::Unary(f, a) => f.flops() + a.flops(),
            EwExpr::Binary(_, a, b) => 1.0 + a.flops() + b.flops(),
        }
    }

    /// Renumbers inputs: input `i` becomes `map[i]`.
    pub fn remap(&self, map: &[usize]) -> EwExpr {
        match self {
            EwExpr::Input(i) => EwExpr::Input(map[*i]),
            EwExpr::Unary(f, a) => EwExpr::Unary(*f, Box::new(a.remap(map))),
            EwExpr::Binary(op, a, b) => EwExpr::Binary(*op, Box::new(a.remap(map)), Box::new(b.remap(map))),
        }
    }

    /// Replaces input `i` by `sub` (used to fuse a producer chain into its consumer).
    pub fn substitute(&self, i: usize, sub: &EwExpr) -> EwExpr {
        match self {
            EwExpr::Input(j) if *j == i => sub.clone(),
            EwExpr::Input(j) => EwExpr::Input(*j),
            EwExpr::Unary(f, a) => EwExpr::Unary(*f, Box::new(a.substitute(i, sub))),
            EwExpr::Binary(op, a, b) => {
                EwExpr::Binary(*op, Box::new(a.substitute(i, sub)), Box::new(b.substitute(i, sub)))
            }
        }
    }
}

impl fmt::Display for EwExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EwExpr::Input(i) => write!(f, "in{i}"),
            EwExpr::Unary(a, x) => write!(f, "{a}({x})"),
            EwExpr::Binary(op, a, b) => write!(f, "{}({a},{b})", op.name()),
        }
    }
}

/// Computes `expr` over `num_inputs` floating-point inputs of one dtype, broadcast together.
#[derive(Clone, Debug)]
pub struct Elementwise {
    pub expr: EwExpr,
    pub num_inputs: usize,
}

impl Elementwise {
    pub fn new(expr: EwExpr, num_inputs: usize) -> OpResult<Elementwise> {
        op_ensure!(expr.arity() <= num_inputs, "elementwise expression {expr} reads more than {num_inputs} inputs");
        Ok(Elementwise { expr, num_inputs })
    }

    pub fn unary(f: Act) -> Elementwise {
        Elementwise { expr: EwExpr::Unary(f, Box::new(EwExpr::Input(0))), num_inputs: 1 }
    }

    pub fn binary(op: BinOp) -> Elementwise {
        Elementwise { expr: EwExpr::Binary(op, Box::new(EwExpr::Input(0)), Box::new(EwExpr::Input(1))), num_inputs: 2 }
    }
}

impl Op for Elementwise {
    fn op_type(&self) -> &'static str {
        "Elementwise"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        op_ensure!(inputs.len() == self.num_inputs, "expected {} inputs, found {}", self.num_inputs, inputs.len());
        let mut facts = Vec::with_capacity(inputs.len());
        for i in 0..self.num_inputs {
            facts.push(required(inputs, i, "operand")?);
        }
        let Some(first) = facts.first() else { op_bail!("an elementwise kernel needs at least one input") };
        let dtype = first.dtype();
        op_ensure!(dtype.is_float(), "elementwise kernels compute on floating-point tensors, found {dtype}");
        for f in &facts {
            op_ensure!(f.dtype() == dtype, "operands have different element types: {dtype} and {}", f.dtype());
        }
        let shapes: Vec<&[crate::ir::Dim]> = facts.iter().map(|f| f.shape()).collect();
        Ok(vec![Fact::new(dtype, broadcast_shapes(&shapes)?)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let mut arrays = Vec::with_capacity(self.num_inputs);
        for i in 0..self.num_inputs {
            arrays.push(required(inputs, i, "operand")?.to_f32());
        }
        let dtype = required(inputs, 0, "operand")?.dtype();
        let out = Tensor::F32(kernels::eval(&self.expr, &arrays)?);
        // `cast` to the same dtype copies: skip it for f32, the common case.
        Ok(vec![if dtype == crate::ir::DType::F32 { out } else { out.cast(dtype) }])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
