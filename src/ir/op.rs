//! The operator interface every IR node implements, and the facts inference works on.

use super::dim::Dim;
use super::dtype::DType;
use super::tensor::Tensor;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Error raised by one operator (parsing, inference or evaluation). The caller adds the file,
/// node name and op type, so messages here say only what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError(pub String);

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OpError {}

impl From<String> for OpError {
    fn from(s: String) -> Self {
        OpError(s)
    }
}

impl From<&str> for OpError {
    fn from(s: &str) -> Self {
        OpError(s.to_string())
    }
}

/// Returns early with an `OpError` built like `format!`.
#[macro_export]
macro_rules! op_bail {
    ($($arg:tt)*) => { return Err($crate::ir::OpError(format!($($arg)*))) };
}

/// Checks a condition, returning an `OpError` built like `format!` when it fails.
#[macro_export]
macro_rules! op_ensure {
    ($cond:expr, $($arg:tt)*) => { if !$cond { $crate::op_bail!($($arg)*); } };
}

pub type OpResult<T> = Result<T, OpError>;

/// Element type and shape of a value. The rank is always known; dims may be symbolic.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueType {
    pub dtype: DType,
    pub shape: Vec<Dim>,
}

impl ValueType {
    pub fn new(dtype: DType, shape: Vec<Dim>) -> Self {
        ValueType { dtype, shape }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The shape as plain numbers when no dim is symbolic.
    pub fn known_shape(&self) -> Option<Vec<usize>> {
        super::dim::known_shape(&self.shape)
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, super::dim::fmt_shape(&self.shape))
    }
}

/// What inference knows about a value: its type, and its contents when they are known at
/// compile time — fully (`konst`) or as symbolic integers (`sym`, for the small rank-0/1 int64
/// tensors of shape subgraphs such as `Shape → Gather → Concat → Reshape`).
#[derive(Clone, Debug)]
pub struct Fact {
    pub ty: ValueType,
    pub konst: Option<Arc<Tensor>>,
    pub sym: Option<Vec<Dim>>,
}

impl Fact {
    pub fn new(dtype: DType, shape: Vec<Dim>) -> Fact {
        Fact { ty: ValueType::new(dtype, shape), konst: None, sym: None }
    }

    pub fn of_type(ty: ValueType) -> Fact {
        Fact { ty, konst: None, sym: None }
    }

    pub fn constant(t: Arc<Tensor>) -> Fact {
        let shape = super::dim::dims_of(t.shape());
        Fact { ty: ValueType::new(t.dtype(), shape), konst: Some(t), sym: None }
    }

    /// A rank-0 (`scalar`) or rank-1 int64 tensor whose elements are (possibly symbolic) dims.
    pub fn symbolic(values: Vec<Dim>, scalar: bool) -> Fact {
        let shape = if scalar { vec![] } else { vec![Dim::from(values.len())] };
        Fact { ty: ValueType::new(DType::I64, shape), konst: None, sym: Some(values) }
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn shape(&self) -> &[Dim] {
        &self.ty.shape
    }

    pub fn rank(&self) -> usize {
        self.ty.shape.len()
    }

    /// The contents as dims: from a constant integer tensor or from symbolic values.
    pub fn as_dims(&self) -> Option<Vec<Dim>> {
        if let Some(s) = &self.sym {
            return Some(s.clone());
        }
        let k = self.konst.as_ref()?;
        if k.dtype().is_float() || k.rank() > 1 {
            return None;
        }
        Some(k.to_i64_vec().into_iter().map(Dim::known).collect())
    }

    /// The contents as plain integers, when fully known.
    pub fn as_ints(&self) -> Option<Vec<i64>> {
        self.as_dims()?.iter().map(|d| d.as_known()).collect()
    }
}

/// One operator of the IR: an ONNX op with typed attributes, or (later) a fused kernel.
///
/// `infer` gives output facts from input facts; `eval` is the reference implementation used by
/// the CPU executor and by constant folding. Absent optional inputs are `None`.
pub trait Op: fmt::Debug + Send + Sync + OpClone + 'static {
    /// The ONNX op type (or kernel name) this op implements.
    fn op_type(&self) -> &'static str;

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>>;

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>>;

    fn as_any(&self) -> &dyn Any;
}

/// Lets `Box<dyn Op>` be cloned; implemented for every `Op + Clone`.
pub trait OpClone {
    fn clone_box(&self) -> Box<dyn Op>;
}

impl<T: Op + Clone> OpClone for T {
    fn clone_box(&self) -> Box<dyn Op> {
        Box::new(self.clone())
    }
}

impl Clone for Box<dyn Op> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

impl dyn Op {
    pub fn downcast_ref<T: Op>(&self) -> Option<&T> {
        self.as_any().downcast_ref::<T>()
    }
}

/// Fetches input `i`, failing with a clear message when it is absent.
pub fn required<'a, T>(inputs: &[Option<&'a T>], i: usize, what: &str) -> OpResult<&'a T> {
    match inputs.get(i) {
        Some(Some(x)) => Ok(x),
        _ => Err(OpError(format!("input {i} ({what}) is required but missing"))),
    }
}

/// Fetches optional input `i` (absent, or beyond the inputs given).
pub fn optional<'a, T>(inputs: &[Option<&'a T>], i: usize) -> Option<&'a T> {
    inputs.get(i).copied().flatten()
}
