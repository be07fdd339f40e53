//! The compiled model as a validation engine: `OUT/libmodel.so` run through [`crate::runtime`].
//!
//! Tolerance: the library stores activations and weights in fp16 and accumulates in fp32, so
//! its float outputs are compared with [`gpu_tolerance`]: `max |gpu - ort| <= atol + rtol *
//! max |ort|` with rtol 1e-2 and atol 1e-4 — one percent of the output's largest magnitude,
//! like the other engines' bounds relative to the output's scale rather than to each element
//! (fp16 keeps about three decimal digits, and a long reduction in fp16 storage loses a few
//! more units of its precision). Integer and bool outputs must match exactly, as for every
//! engine. `--rtol` / `--atol` override the bounds of every engine; `--gpu-rtol` overrides this
//! engine's rtol alone (for a network whose own fp16 error is known to exceed one percent, without
//! loosening the fp32 reference executor's bound).
//!
//! Dims: the library fixes some dims at compile time and takes the others (its run-time dims:
//! the batch, and any compiled with a range) at each run. Validation sets the run-time dims from
//! `--batch B` and `--dim NAME=V` (a value outside the library's range is an error; an unset
//! batch is 1, any other unset run-time dim its largest value), and takes the values of the
//! other symbolic dims of the graph inputs from the library's input shapes there (the user's
//! `--dim` must agree with them).

use super::compare::Tolerance;
use super::inputs::DEFAULT_DIM;
use super::Engine;
use crate::error::{Error, Result};
use crate::ir::{DType, Dim, Graph, Tensor};
use crate::runtime::{Library, Model};
use std::collections::BTreeMap;
use std::path::Path;

/// Default bounds of the GPU's float outputs (see the module docs).
pub fn gpu_tolerance(dtype: DType) -> Tolerance {
    if dtype.is_float() {
        Tolerance { rtol: 1e-2, atol: 1e-4 }
    } else {
        Tolerance::default_for(dtype)
    }
}

/// The compiled library of a model, instantiated on the current GPU.
pub struct GpuEngine {
    model: Model,
    description: String,
}

impl GpuEngine {
    /// Loads `OUT/libmodel.so` and creates the model on the GPU (fails with "no CUDA device: …"
    /// on a machine without one).
    pub fn open(out_dir: &Path) -> Result<GpuEngine> {
        let model = Model::load(out_dir)?;
        let lib = model.library();
        let dims: Vec<String> = lib
            .run_dims()
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let what = if lib.batch_dim() == Some(i) { "batch" } else { "dim" };
                format!("{what} '{}' {} to {}", d.symbol, d.min, d.max)
            })
            .collect();
        let dims = if dims.is_empty() { "fixed shapes".to_string() } else { dims.join(", ") };
        let description = format!(
            "onnx2ait GPU library {} (model '{}', {dims}) on {}",
            lib.path().display(),
            lib.model_name(),
            model.device_name()
        );
        Ok(GpuEngine { model, description })
    }

    pub fn library(&self) -> &Library {
        self.model.library()
    }

    /// The values of the graph inputs' symbolic dims in the library at the run-time dims
    /// `values`: each dim that is a single symbol takes the library's size there.
    pub fn dims_at(&self, graph: &Graph, values: &[i64]) -> Result<BTreeMap<String, i64>> {
        let lib = self.library();
        let mut dims: BTreeMap<String, i64> = BTreeMap::new();
        for &id in &graph.inputs {
            let v = graph.value(id);
            let Some(ty) = &v.ty else { continue };
            let Some(i) = lib.inputs().iter().position(|x| x.name == v.name) else {
                return Err(self.mismatch(&format!("the model has input '{}', the library does not", v.name)));
            };
            let shape = lib.input_shape(i, values)?;
            if shape.len() != ty.shape.len() {
                return Err(self.mismatch(&format!(
                    "input '{}' has rank {} in the model and {} in the library",
                    v.name,
                    ty.shape.len(),
                    shape.len()
                )));
            }
            for (d, &size) in ty.shape.iter().zip(&shape) {
                let syms: Vec<&str> = d.symbols().collect();
                let [s] = syms.as_slice() else { continue };
                if *d != Dim::sym(*s) {
                    continue;
                }
                let size = size as i64;
                if let Some(&old) = dims.get(*s) {
                    if old != size {
                        return Err(self.mismatch(&format!("dim '{s}' is {old} in one input and {size} in another")));
                    }
                }
                dims.insert(s.to_string(), size);
            }
        }
        Ok(dims)
    }

    fn mismatch(&self, what: &str) -> Error {
        Error::Other(format!("{}: built from another model? {what}", self.library().dir().display()))
    }
}

/// The GPU engine's column name in reports.
pub const ENGINE_NAME: &str = "gpu";

impl Engine for GpuEngine {
    fn name(&self) -> &'static str {
        ENGINE_NAME
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    fn default_tolerance(&self, dtype: DType) -> Tolerance {
        gpu_tolerance(dtype)
    }

    fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let lib = self.model.library();
        let mut ordered: Vec<Tensor> = Vec::with_capacity(lib.inputs().len());
        for info in lib.inputs() {
            let t = inputs.iter().find(|(n, _)| *n == info.name).ok_or_else(|| {
                Error::Other(format!("{}: no value for the library's input '{}'", lib.dir().display(), info.name))
            })?;
            ordered.push(t.1.clone());
        }
        let shapes: Vec<Option<&[usize]>> = ordered.iter().map(|t| Some(t.shape())).collect();
        let dims = lib.infer_dims(&shapes)?;
        let names: Vec<String> = lib.outputs().iter().map(|o| o.name.clone()).collect();
        let outputs = self.model.run_host(&dims, &ordered)?;
        Ok(names.into_iter().zip(outputs).collect())
    }
}

/// Sets the dims the validation inputs are made with: `--batch B` for the batch dim (the
/// library's, or the only symbolic dim of the graph inputs), and, with a library, its run-time
/// dims (the user's value, checked against the library's range; else 1 for the batch and the
/// largest value for the others) and every dim the library fixed. `dims` holds the user's
/// `--dim` values; a conflict with the library is an error.
pub fn bind_dims(
    graph: &Graph,
    gpu: Option<&GpuEngine>,
    batch: Option<i64>,
    dims: &mut BTreeMap<String, i64>,
) -> Result<()> {
    let path = graph.info.source.as_str();
    if let Some(b) = batch {
        if b < 1 {
            return Err(Error::model(path, format!("--batch {b}: the batch must be at least 1")));
        }
        let symbol = match gpu {
            Some(g) => match g.library().batch_symbol() {
                Some(s) => s.to_string(),
                None if b == 1 => String::new(),
                None => {
                    return Err(Error::model(
                        path,
                        format!(
                            "--batch {b}: the library in {} has no run-time batch dim",
                            g.library().dir().display()
                        ),
                    ))
                }
            },
            None => only_input_symbol(graph).map_err(|m| Error::model(path, format!("--batch {b}: {m}")))?,
        };
        if !symbol.is_empty() {
            if let Some(&v) = dims.get(&symbol) {
                if v != b {
                    return Err(Error::model(path, format!("--batch {b} and --dim {symbol}={v} disagree")));
                }
            }
            dims.insert(symbol, b);
        }
    }
    let Some(g) = gpu else { return Ok(()) };
    let lib = g.library();
    let values: Vec<i64> = lib
        .run_dims()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let default = if lib.batch_dim() == Some(i) { DEFAULT_DIM.max(d.min) } else { d.max };
            dims.get(&d.symbol).copied().unwrap_or(default)
        })
        .collect();
    lib.check_dims(&values)?;
    for (s, v) in g.dims_at(graph, &values)? {
        match dims.get(&s) {
            Some(&user) if user != v => {
                return Err(Error::model(
                    path,
                    format!("--dim {s}={user}, but the library in {} was built with {s}={v}", lib.dir().display()),
                ))
            }
            _ => {
                dims.insert(s, v);
            }
        }
    }
    Ok(())
}

/// The one symbolic dim of the graph inputs, which `--batch` then names.
fn only_input_symbol(graph: &Graph) -> std::result::Result<String, String> {
    let mut symbols: Vec<String> = Vec::new();
    for &id in &graph.inputs {
        if let Some(ty) = &graph.value(id).ty {
            for d in &ty.shape {
                for s in d.symbols() {
                    if !symbols.iter().any(|x| x == s) {
                        symbols.push(s.to_string());
                    }
                }
            }
        }
    }
    match symbols.as_slice() {
        [s] => Ok(s.clone()),
        [] => Err("the model inputs have no symbolic dim to use as the batch".to_string()),
        many => Err(format!(
            "the model inputs have {} symbolic dims ({}); set the batch with --dim NAME=VALUE",
            many.len(),
            many.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ValueType;

    fn graph(inputs: &[(&str, Vec<Dim>)]) -> Graph {
        let mut g = Graph::default();
        g.info.source = "m.onnx".into();
        for (name, shape) in inputs {
            let id = g.add_value(name.to_string(), Some(ValueType::new(DType::F32, shape.clone())));
            g.inputs.push(id);
        }
        g
    }

    #[test]
    fn batch_names_the_only_symbol_without_a_library() {
        let g = graph(&[("x", vec![Dim::sym("N"), Dim::known(3)]), ("y", vec![Dim::sym("N")])]);
        let mut dims = BTreeMap::new();
        bind_dims(&g, None, Some(4), &mut dims).unwrap();
        assert_eq!(dims, BTreeMap::from([("N".to_string(), 4)]));
        let mut dims = BTreeMap::from([("N".to_string(), 2)]);
        let e = bind_dims(&g, None, Some(4), &mut dims).unwrap_err().to_string();
        assert!(e.contains("--batch 4 and --dim N=2 disagree"), "{e}");
        let g2 = graph(&[("x", vec![Dim::sym("N"), Dim::sym("S")])]);
        let e = bind_dims(&g2, None, Some(4), &mut BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("2 symbolic dims (N, S)") && e.contains("--dim"), "{e}");
        let g3 = graph(&[("x", vec![Dim::known(3)])]);
        let e = bind_dims(&g3, None, Some(4), &mut BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("no symbolic dim"), "{e}");
        let e = bind_dims(&g, None, Some(0), &mut BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("at least 1"), "{e}");
        let mut untouched = BTreeMap::new();
        bind_dims(&g3, None, None, &mut untouched).unwrap();
        assert!(untouched.is_empty());
    }

    /// Fixed outputs held to the GPU's bounds or the default ones.
    struct Fixed(&'static str, Vec<(String, Tensor)>, bool);

    impl Engine for Fixed {
        fn name(&self) -> &'static str {
            self.0
        }
        fn describe(&self) -> String {
            self.0.to_string()
        }
        fn run(&mut self, _: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
            Ok(self.1.clone())
        }
        fn default_tolerance(&self, dtype: DType) -> Tolerance {
            if self.2 {
                gpu_tolerance(dtype)
            } else {
                Tolerance::default_for(dtype)
            }
        }
    }

    #[test]
    fn each_engine_has_its_own_bounds() {
        let logits = |v: Vec<f32>| vec![("logits".to_string(), Tensor::from_f32s(&[2, 2], v))];
        let base = logits(vec![1.0, 2.0, 4.0, 3.99]);
        // 0.5% of the largest magnitude off, and the second row's arg-max flipped by less.
        let off = logits(vec![1.0, 2.02, 3.99, 4.0]);
        let engines: Vec<Box<dyn Engine>> = vec![
            Box::new(Fixed("ort", base, false)),
            Box::new(Fixed("reference", off.clone(), false)),
            Box::new(Fixed("gpu", off, true)),
        ];
        let inputs = super::super::inputs::Inputs { tensors: vec![], sources: vec![], dims: BTreeMap::new() };
        let r = super::super::run_engines("m.onnx", inputs, engines, &super::super::Options::default()).unwrap();
        let f = r.failures();
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].1, "reference");
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        let gpu = &json["outputs"][0]["results"][1];
        assert_eq!(gpu["engine"], "gpu");
        assert_eq!(gpu["baseline"], "ort");
        assert_eq!(gpu["status"], "pass");
        assert_eq!(gpu["top1_agree"], 0.5);
        assert_eq!(gpu["tolerance"]["rtol"], 1e-2);
        assert!(gpu["max_abs"].as_f64().unwrap() > 0.0 && gpu["max_rel"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn gpu_bounds_are_fp16_wide() {
        let t = gpu_tolerance(DType::F32);
        assert_eq!((t.rtol, t.atol), (1e-2, 1e-4));
        assert_eq!(gpu_tolerance(DType::I64), Tolerance::default_for(DType::I64));
    }
}
