//! The einsum op family: Einsum, Einstein summation given by an equation string.
//!
//! The equation is parsed once when the node is imported. Against the input ranks it resolves
//! to integer labels: letters keep their ASCII order (`A`–`Z` are 0–25, `a`–`z` 26–51, so the
//! implicit output is sorted like numpy's) and the dims an ellipsis stands for get labels 52 and
//! up, right-aligned across operands so they broadcast like numpy batch dims.

use super::OpSpec;
use crate::ir::dim::fmt_shape;
use crate::ir::{DType, Dim, Fact, NodeCtx, Op, OpError, OpResult, Tensor};
use crate::reference::einsum::einsum;
use crate::reference::linalg::{matmul, matmul_int};
use crate::{op_bail, op_ensure};
use ndarray::ArrayD;
use std::any::Any;

pub const OPS: &[OpSpec] = &[OpSpec::onnx("Einsum", parse_einsum)];

/// Number of letter labels; ellipsis dims are labelled from here on.
const LETTERS: usize = 52;

/// One subscript of an operand or of the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sub {
    Letter(usize),
    Ellipsis,
}

/// A parsed equation: one term per input and, when written with `->`, the output term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Equation {
    inputs: Vec<Vec<Sub>>,
    output: Option<Vec<Sub>>,
}

fn letter_id(c: char) -> Option<usize> {
    match c {
        'A'..='Z' => Some(c as usize - 'A' as usize),
        'a'..='z' => Some(26 + c as usize - 'a' as usize),
        _ => None,
    }
}

fn label_name(l: usize) -> String {
    match l {
        0..=25 => ((b'A' + l as u8) as char).to_string(),
        26..=51 => ((b'a' + (l - 26) as u8) as char).to_string(),
        _ => format!("... dim {}", l - LETTERS),
    }
}

fn parse_term(term: &str, eq: &str) -> OpResult<Vec<Sub>> {
    let mut subs = Vec::new();
    let mut rest = term;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("...") {
            op_ensure!(
                !subs.contains(&Sub::Ellipsis),
                "Einsum: equation '{eq}': term '{term}' has more than one ellipsis"
            );
            subs.push(Sub::Ellipsis);
            rest = after;
            continue;
        }
        match letter_id(c) {
            Some(id) => subs.push(Sub::Letter(id)),
            None => op_bail!("Einsum: equation '{eq}': '{c}' is not a subscript (letters a-z, A-Z and '...' only)"),
        }
        rest = &rest[c.len_utf8()..];
    }
    Ok(subs)
}

/// Parses `"ij,jk->ik"`, `"bij,bjk"` (implicit output), `"...ii->...i"`; whitespace is ignored.
pub fn parse_equation(eq: &str) -> OpResult<Equation> {
    let compact: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match compact.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (compact.as_str(), None),
    };
    let inputs = lhs.split(',').map(|t| parse_term(t, eq)).collect::<OpResult<Vec<_>>>()?;
    let output = match rhs {
        None => None,
        Some(r) => {
            op_ensure!(!r.contains("->"), "Einsum: equation '{eq}' has more than one '->'");
            let out = parse_term(r, eq)?;
            for (i, s) in out.iter().enumerate() {
                if let Sub::Letter(l) = s {
                    op_ensure!(
                        !out[..i].contains(s),
                        "Einsum: equation '{eq}': output label '{}' is repeated",
                        label_name(*l)
                    );
                    op_ensure!(
                        inputs.iter().any(|t| t.contains(s)),
                        "Einsum: equation '{eq}': output label '{}' appears in no input",
                        label_name(*l)
                    );
                }
            }
            let input_ellipsis = inputs.iter().any(|t| t.contains(&Sub::Ellipsis));
            op_ensure!(
                !input_ellipsis || out.contains(&Sub::Ellipsis),
                "Einsum: equation '{eq}': inputs have an ellipsis but the output does not"
            );
            Some(out)
        }
    };
    Ok(Equation { inputs, output })
}

/// The equation resolved against concrete input ranks.
struct Resolved {
    /// One label per axis of each input.
    inputs: Vec<Vec<usize>>,
    output: Vec<usize>,
    num_labels: usize,
}

impl Equation {
    fn resolve(&self, ranks: &[usize], eq: &str) -> OpResult<Resolved> {
        op_ensure!(
            ranks.len() == self.inputs.len(),
            "Einsum: equation '{eq}' has {} operand(s) but the node has {} input(s)",
            self.inputs.len(),
            ranks.len()
        );
        // Dims covered by each input's ellipsis.
        let mut ell = Vec::with_capacity(ranks.len());
        for (i, (term, &rank)) in self.inputs.iter().zip(ranks).enumerate() {
            let letters = term.iter().filter(|s| matches!(s, Sub::Letter(_))).count();
            let has_ell = term.contains(&Sub::Ellipsis);
            op_ensure!(
                rank == letters || (has_ell && rank > letters),
                "Einsum: equation '{eq}': input {i} has rank {rank} but its term has {letters} subscript(s){}",
                if has_ell { " and an ellipsis" } else { "" }
            );
            ell.push(rank - letters);
        }
        let e = ell.iter().copied().max().unwrap_or(0);
        let expand = |term: &[Sub], k: usize| -> Vec<usize> {
            let mut out = Vec::new();
            for s in term {
                match s {
                    Sub::Letter(l) => out.push(*l),
                    Sub::Ellipsis => out.extend((e - k..e).map(|d| LETTERS + d)),
                }
            }
            out
        };
        let inputs: Vec<Vec<usize>> = self.inputs.iter().zip(&ell).map(|(t, &k)| expand(t, k)).collect();
        let output = match &self.output {
            Some(out) => expand(out, e),
            None => {
                // numpy's implicit output: the ellipsis dims, then the letters used exactly once,
                // in label (ASCII) order.
                let mut count = [0usize; LETTERS];
                for s in self.inputs.iter().flatten() {
                    if let Sub::Letter(l) = s {
                        count[*l] += 1;
                    }
                }
                (LETTERS..LETTERS + e).chain((0..LETTERS).filter(|&l| count[l] == 1)).collect()
            }
        };
        Ok(Resolved { inputs, output, num_labels: LETTERS + e })
    }
}

#[derive(Clone, Debug)]
pub struct Einsum {
    pub equation: String,
    parsed: Equation,
}

const TYPES: [DType; 8] =
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U32, DType::U64];

impl Einsum {
    fn check_dtypes(&self, dtypes: &[DType]) -> OpResult<DType> {
        let first = *dtypes.first().ok_or_else(|| OpError("Einsum needs at least one input".into()))?;
        op_ensure!(TYPES.contains(&first), "Einsum does not support element type {first} (expected one of {TYPES:?})");
        for (i, d) in dtypes.iter().enumerate() {
            op_ensure!(*d == first, "Einsum: input {i} is {d}, input 0 is {first}");
        }
        Ok(first)
    }

    /// Resolves labels and the size of each label: equal sizes, or 1 broadcast to the other;
    /// a known size wins over a symbolic one (equal at run time by the model's contract).
    fn label_dims(&self, shapes: &[&[Dim]]) -> OpResult<(Resolved, Vec<Option<Dim>>)> {
        let ranks: Vec<usize> = shapes.iter().map(|s| s.len()).collect();
        let r = self.parsed.resolve(&ranks, &self.equation)?;
        let mut dims: Vec<Option<Dim>> = vec![None; r.num_labels];
        let one = Dim::known(1);
        for (i, (labels, shape)) in r.inputs.iter().zip(shapes).enumerate() {
            // Within one operand a repeated label (a diagonal) needs equal sizes.
            for (a, la) in labels.iter().enumerate() {
                if let Some(b) = labels[..a].iter().position(|lb| lb == la) {
                    if let (Some(x), Some(y)) = (shape[a].as_known(), shape[b].as_known()) {
                        op_ensure!(
                            x == y,
                            "Einsum: equation '{}': label '{}' of input {i} {} has sizes {y} and {x}",
                            self.equation,
                            label_name(*la),
                            fmt_shape(shape)
                        );
                    }
                }
            }
            for (&l, d) in labels.iter().zip(shape.iter()) {
                let slot = &mut dims[l];
                *slot = Some(match slot.take() {
                    None => d.clone(),
                    Some(cur) if cur == *d || *d == one => cur,
                    Some(cur) if cur == one => d.clone(),
                    Some(cur) => match (cur.as_known(), d.as_known()) {
                        (Some(x), Some(y)) => op_bail!(
                            "Einsum: equation '{}': label '{}' has sizes {x} and {y}, which cannot be broadcast together (input {i} {})",
                            self.equation,
                            label_name(l),
                            fmt_shape(shape)
                        ),
                        (Some(_), None) => cur,
                        (None, Some(_)) => d.clone(),
                        (None, None) => cur.max_dim(d),
                    },
                });
            }
        }
        Ok((r, dims))
    }
}

impl Op for Einsum {
    fn op_type(&self) -> &'static str {
        "Einsum"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let xs: Vec<&Fact> = inputs
            .iter()
            .enumerate()
            .map(|(i, x)| x.ok_or_else(|| OpError(format!("input {i} is required but missing"))))
            .collect::<OpResult<_>>()?;
        let dtype = self.check_dtypes(&xs.iter().map(|x| x.dtype()).collect::<Vec<_>>())?;
        let shapes: Vec<&[Dim]> = xs.iter().map(|x| x.shape()).collect();
        let (r, dims) = self.label_dims(&shapes)?;
        let shape = r.output.iter().map(|&l| dims[l].clone().unwrap_or_else(|| Dim::known(1))).collect();
        Ok(vec![Fact::new(dtype, shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let xs: Vec<&Tensor> = inputs
            .iter()
            .enumerate()
            .map(|(i, x)| x.ok_or_else(|| OpError(format!("input {i} is required but missing"))))
            .collect::<OpResult<_>>()?;
        let dtype = self.check_dtypes(&xs.iter().map(|x| x.dtype()).collect::<Vec<_>>())?;
        let dim_shapes: Vec<Vec<Dim>> = xs.iter().map(|x| crate::ir::dim::dims_of(x.shape())).collect();
        let refs: Vec<&[Dim]> = dim_shapes.iter().map(|s| s.as_slice()).collect();
        let (r, dims) = self.label_dims(&refs)?;
        // Labels no input uses (ellipsis dims of size 0 rank) do not occur; unused slots are 1.
        let dims: Vec<usize> =
            dims.iter().map(|d| d.as_ref().and_then(|d| d.as_known()).unwrap_or(1) as usize).collect();
        fn run<T: crate::reference::scatter::Reducible>(
            arrays: Vec<&ArrayD<T>>,
            r: &Resolved,
            dims: &[usize],
            bmm: crate::reference::einsum::BatchedMatMul<T>,
        ) -> OpResult<ArrayD<T>> {
            let ops: Vec<(&ArrayD<T>, Vec<usize>)> = arrays.into_iter().zip(r.inputs.iter().cloned()).collect();
            einsum(&ops, &r.output, dims, bmm)
        }
        macro_rules! ints {
            ($variant:ident, $t:ty) => {{
                let arrays: Vec<&ArrayD<$t>> = xs
                    .iter()
                    .map(|x| match x {
                        Tensor::$variant(a) => Ok(a),
                        other => Err(OpError(format!("Einsum: mixed input types ({})", other.dtype()))),
                    })
                    .collect::<OpResult<_>>()?;
                Tensor::$variant(run(arrays, &r, &dims, |a, b| matmul_int(a.view(), b.view()))?)
            }};
        }
        let out = match dtype {
            DType::I32 => ints!(I32, i32),
            DType::I64 => ints!(I64, i64),
            DType::U32 => ints!(U32, u32),
            DType::U64 => ints!(U64, u64),
            // Floats compute in f32 (products through SGEMM) and round back once.
            _ => {
                let owned: Vec<ArrayD<f32>> = xs.iter().map(|x| x.to_f32()).collect();
                let y = run(owned.iter().collect(), &r, &dims, matmul)?;
                Tensor::F32(y).cast(dtype)
            }
        };
        Ok(vec![out])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Einsum (opset 12, unchanged since): numpy-style Einstein summation. Supported: explicit
/// (`->`) and implicit outputs (ellipsis dims first, then the letters used once, sorted
/// ASCII-wise: uppercase before lowercase), ellipsis broadcasting (numpy rules, right-aligned),
/// size-1 dims broadcasting against a label's size (as ONNX Runtime does), repeated labels in
/// an input (diagonals, e.g. `ii->i`, trace `ii`), any number of operands. Rejected like ONNX
/// Runtime: repeated output labels, output labels no input has, an explicit output without an
/// ellipsis when an input has one. Element types: float32/64, float16, bfloat16, int32/64,
/// uint32/64.
fn parse_einsum(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let equation = ctx.req_string("equation")?;
    let parsed = parse_equation(&equation)?;
    op_ensure!(
        parsed.inputs.len() == ctx.num_inputs(),
        "Einsum: equation '{equation}' has {} operand(s) but the node has {} input(s)",
        parsed.inputs.len(),
        ctx.num_inputs()
    );
    Ok(Box::new(Einsum { equation, parsed }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Attr;

    fn parse(eq: &str, n_in: usize) -> OpResult<Box<dyn Op>> {
        let attrs = [("equation", Attr::String(eq.into()))];
        crate::ir::ops::testutil::parse_node("Einsum", 12, &attrs, &vec![true; n_in], 1)
    }

    fn dims(s: &[&str]) -> Vec<Dim> {
        s.iter().map(|v| v.parse::<i64>().map(Dim::known).unwrap_or_else(|_| Dim::sym(*v))).collect()
    }

    fn out_shape(eq: &str, shapes: &[&[&str]]) -> OpResult<String> {
        let facts: Vec<Fact> = shapes.iter().map(|s| Fact::new(DType::F32, dims(s))).collect();
        let refs: Vec<Option<&Fact>> = facts.iter().map(Some).collect();
        Ok(fmt_shape(parse(eq, shapes.len())?.infer(&refs)?[0].shape()))
    }

    /// Deterministic test data: `sin(i * 0.7 + seed)` (the same formula numpy used for the
    /// expected values below).
    fn data(shape: &[usize], seed: f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_f32s(shape, (0..n).map(|i| (i as f32 * 0.7 + seed).sin()).collect())
    }

    fn eval(eq: &str, xs: &[&Tensor]) -> OpResult<Tensor> {
        let args: Vec<Option<&Tensor>> = xs.iter().map(|t| Some(*t)).collect();
        Ok(parse(eq, xs.len())?.eval(&args)?.remove(0))
    }

    fn assert_close(t: &Tensor, want: &[f64]) {
        let got = t.to_f64_vec();
        assert_eq!(got.len(), want.len(), "{t:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1.5e-4, "got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn infer_shapes_keep_symbols() {
        assert_eq!(out_shape("bij,bjk->bik", &[&["B", "S", "64"], &["B", "64", "T"]]).unwrap(), "[B,S,T]");
        assert_eq!(out_shape("ij,jk", &[&["2", "3"], &["3", "4"]]).unwrap(), "[2,4]");
        assert_eq!(out_shape("...ij,...jk", &[&["N", "1", "3", "4"], &["5", "4", "2"]]).unwrap(), "[N,5,3,2]");
        assert_eq!(out_shape("ii->i", &[&["S", "S"]]).unwrap(), "[S]");
        assert_eq!(out_shape("ij->", &[&["2", "3"]]).unwrap(), "[]");
        assert_eq!(out_shape("ba,Ac", &[&["2", "3"], &["4", "5"]]).unwrap(), "[4,3,2,5]");
        assert_eq!(out_shape("ij,jk", &[&["2", "1"], &["3", "4"]]).unwrap(), "[2,4]");
    }

    #[test]
    fn bad_equations_fail_clearly() {
        let e = |eq: &str, n: usize| parse(eq, n).unwrap_err().0;
        assert!(e("ij->ii", 1).contains("repeated"));
        assert!(e("ij->k", 1).contains("appears in no input"));
        assert!(e("...ij->ij", 1).contains("ellipsis"));
        assert!(e("i.j", 1).contains("not a subscript"));
        assert!(e("i1", 1).contains("not a subscript"));
        assert!(e("ij,jk", 1).contains("2 operand(s)"));
        assert!(e("i->i->i", 1).contains("'->'") || e("i->i->i", 1).contains("subscript"));
        assert!(out_shape("ijk", &[&["2", "3"]]).unwrap_err().0.contains("rank 2"));
        assert!(out_shape("ij,jk", &[&["2", "3"], &["4", "5"]]).unwrap_err().0.contains("sizes 3 and 4"));
        assert!(out_shape("ii", &[&["2", "3"]]).unwrap_err().0.contains("sizes 2 and 3"));
        let x = Fact::new(DType::U8, dims(&["2"]));
        assert!(parse("i", 1).unwrap().infer(&[Some(&x)]).unwrap_err().0.contains("uint8"));
    }

    #[test]
    fn values_match_ort() {
        // Expected values from ONNX Runtime (opset 12) on the `data` tensors.
        let a = data(&[2, 3], 0.0);
        let b = data(&[3, 4], 1.0);
        assert_close(
            &eval("ij,jk->ik", &[&a, &b]).unwrap(),
            &[-0.0872, 0.2083, 0.4058, 0.4125, 0.4121, 0.2302, -0.0599, -0.3219],
        );
        let sq = data(&[3, 3], 0.5);
        assert_close(&eval("ii", &[&sq]).unwrap(), &[0.1395]);
        assert_close(&eval("ii->i", &[&sq]).unwrap(), &[0.4794, -0.1577, -0.1822]);
        let t = data(&[2, 3, 2], 0.2);
        assert_close(&eval("iji->j", &[&t]).unwrap(), &[-0.7271, 1.2147, 1.1401]);
        let x = data(&[2, 1, 3, 4], 0.3);
        let y = data(&[5, 4, 2], 0.4);
        let z = eval("...ij,...jk", &[&x, &y]).unwrap();
        assert_eq!(z.shape(), &[2, 5, 3, 2]);
        assert_close(
            &Tensor::from_f32s(&[2], z.to_f64_vec()[58..].iter().map(|&v| v as f32).collect()),
            &[-1.843, -1.4742],
        );
        let c = data(&[4, 5], 2.0);
        assert_close(
            &eval("ij,jk,kl->li", &[&a, &b, &c]).unwrap().reshaped(&[10]).unwrap(),
            &[-0.0863, 0.2089, 0.0794, -0.0173, 0.2077, -0.2354, 0.2384, -0.3428, 0.157, -0.289],
        );
        // Outer product, and a size-1 label dim broadcast against 3.
        assert_eq!(eval("i,j", &[&data(&[3], 0.0), &data(&[2], 1.0)]).unwrap().shape(), &[3, 2]);
        let col = data(&[2, 1], 0.0);
        assert_close(&eval("ij,jk", &[&col, &b]).unwrap(), &[0.0, 0.0, 0.0, 0.0, 0.3486, 0.557, 0.5034, 0.213]);
    }

    #[test]
    fn integers_are_exact_and_halves_round_trip() {
        let a = Tensor::from_i64s(&[2, 2], vec![1 << 40, 2, 3, 4]);
        let b = Tensor::from_i64s(&[2], vec![3, 1]);
        let y = eval("ij,j->i", &[&a, &b]).unwrap();
        assert_eq!(y.to_i64_vec(), vec![3 * (1 << 40) + 2, 13]);
        let y32 = eval("ij->j", &[&a.cast(DType::I32)]).unwrap();
        assert_eq!(y32.dtype(), DType::I32);
        let h = eval("ij->ji", &[&data(&[2, 3], 0.0).cast(DType::F16)]).unwrap();
        assert_eq!((h.dtype(), h.shape()), (DType::F16, &[3usize, 2][..]));
        assert!(eval("ij,j->i", &[&a, &b.cast(DType::I32)]).unwrap_err().0.contains("input 1 is int32"));
    }
}
