//! ONNX `ModelProto` → IR `Graph`: values, nodes with typed ops, topological order, inference.

use super::attr::attr_from_proto;
use super::proto::{type_proto, GraphProto, ModelProto, ValueInfoProto};
use super::tensor::tensor_from_proto;
use crate::error::{Error, Result, UnsupportedOp};
use crate::ir::ops::{normalize_domain, registry};
use crate::ir::{Attributes, DType, Dim, Graph, ModelInfo, Node, NodeCtx, ValueId, ValueType};
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A decoded ONNX file, before it becomes IR.
pub struct ModelFile {
    pub path: PathBuf,
    pub proto: ModelProto,
}

/// Files above this size are memory-mapped instead of read into a buffer.
const MMAP_THRESHOLD: u64 = 1 << 20;

impl ModelFile {
    pub fn open(path: &Path) -> Result<ModelFile> {
        let src = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|e| Error::model(&src, format!("cannot open: {e}")))?;
        let len = file.metadata().map_err(|e| Error::model(&src, format!("cannot read: {e}")))?.len();
        if len == 0 {
            return Err(Error::model(&src, "file is empty, not an ONNX model"));
        }
        let proto = if len >= MMAP_THRESHOLD {
            // SAFETY: read-only mapping of a file we only read; prost copies what it keeps.
            let map =
                unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::model(&src, format!("cannot map: {e}")))?;
            decode(&map, &src)?
        } else {
            let bytes = std::fs::read(path).map_err(|e| Error::model(&src, format!("cannot read: {e}")))?;
            decode(&bytes, &src)?
        };
        Ok(ModelFile { path: path.to_path_buf(), proto })
    }

    /// Decodes a model held in memory; `path` names it in messages and anchors external data.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<ModelFile> {
        let proto = decode(bytes, &path.display().to_string())?;
        Ok(ModelFile { path: path.to_path_buf(), proto })
    }

    pub fn source(&self) -> String {
        self.path.display().to_string()
    }

    fn graph(&self) -> Result<&GraphProto> {
        self.proto.graph.as_ref().ok_or_else(|| Error::model(&self.source(), "the model has no graph"))
    }

    /// Opset version per domain ("" for the default ONNX domain).
    pub fn opsets(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for o in &self.proto.opset_import {
            let d = normalize_domain(o.domain.as_deref().unwrap_or("")).to_string();
            m.insert(d, o.version.unwrap_or(1));
        }
        m
    }

    /// Every op type the registry does not support, with the nodes that use it.
    pub fn unsupported_ops(&self) -> Vec<UnsupportedOp> {
        let Ok(graph) = self.graph() else { return Vec::new() };
        let names = node_names(graph);
        let mut found: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for (node, name) in graph.node.iter().zip(&names) {
            let op = node.op_type.as_deref().unwrap_or("");
            let domain = normalize_domain(node.domain.as_deref().unwrap_or(""));
            if registry().lookup(domain, op).is_none() && !super::sequence::is_sequence_op(domain, op) {
                found.entry((domain.to_string(), op.to_string())).or_default().push(name.clone());
            }
        }
        found.into_iter().map(|((domain, op_type), nodes)| UnsupportedOp { domain, op_type, nodes }).collect()
    }

    /// Builds the IR graph: typed values and ops, topological order, inference and folding.
    /// Sequence ops are first lowered to tensor ops (see `sequence.rs`).
    pub fn to_graph(&self) -> Result<Graph> {
        match super::sequence::lower_sequences(self)? {
            Some(lowered) => Importer::new(&lowered)?.build(),
            None => Importer::new(self)?.build(),
        }
    }
}

fn decode(bytes: &[u8], src: &str) -> Result<ModelProto> {
    if bytes.is_empty() {
        return Err(Error::model(src, "file is empty, not an ONNX model"));
    }
    ModelProto::decode(bytes)
        .map_err(|e| Error::model(src, format!("not a valid ONNX model (protobuf decoding failed: {e})")))
}

/// Stable, unique node names: the model's own where present and unique, else `<OpType>_<index>`.
pub(super) fn node_names(graph: &GraphProto) -> Vec<String> {
    let mut used = BTreeSet::new();
    graph
        .node
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let given = n.name.clone().unwrap_or_default();
            let mut name =
                if given.is_empty() { format!("{}_{i}", n.op_type.as_deref().unwrap_or("node")) } else { given };
            if used.contains(&name) {
                let base = name.clone();
                let mut k = 1;
                while used.contains(&name) {
                    name = format!("{base}_{k}");
                    k += 1;
                }
            }
            used.insert(name.clone());
            name
        })
        .collect()
}

struct Importer<'a> {
    mf: &'a ModelFile,
    src: String,
    base_dir: PathBuf,
    graph: Graph,
    by_name: BTreeMap<String, ValueId>,
    fresh_dims: usize,
}

impl<'a> Importer<'a> {
    fn new(mf: &'a ModelFile) -> Result<Self> {
        let src = mf.source();
        let base_dir = mf.path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
        Ok(Importer { mf, src, base_dir, graph: Graph::default(), by_name: BTreeMap::new(), fresh_dims: 0 })
    }

    fn err(&self, msg: impl Into<String>) -> Error {
        Error::model(&self.src, msg)
    }

    fn build(mut self) -> Result<Graph> {
        let gp = self.mf.graph()?;
        let opsets = self.mf.opsets();
        if !opsets.contains_key("") {
            return Err(self.err("the model imports no opset of the default ONNX domain"));
        }
        self.graph.info = ModelInfo {
            source: self.src.clone(),
            ir_version: self.mf.proto.ir_version.unwrap_or(0),
            producer: format!(
                "{} {}",
                self.mf.proto.producer_name.as_deref().unwrap_or(""),
                self.mf.proto.producer_version.as_deref().unwrap_or("")
            )
            .trim()
            .to_string(),
            graph_name: gp.name.clone().unwrap_or_default(),
            opsets: opsets.clone(),
            warnings: super::opset_warning(&opsets).into_iter().collect(),
        };
        if gp.node.is_empty() {
            return Err(self.err("the graph is empty (no nodes)"));
        }
        if !gp.sparse_initializer.is_empty() {
            return Err(self.err("sparse initializers are not supported"));
        }
        self.add_initializers(gp)?;
        self.add_inputs(gp)?;
        let nodes = self.add_nodes(gp, &opsets)?;
        self.graph.nodes = self.topo_sort(nodes)?;
        for out in &gp.output {
            let name = out.name.as_deref().unwrap_or("");
            let id = *self.by_name.get(name).ok_or_else(|| {
                self.err(format!("graph output '{name}' is not produced by any node, initializer or input"))
            })?;
            self.graph.outputs.push(id);
        }
        if self.graph.outputs.is_empty() {
            return Err(self.err("the graph has no outputs"));
        }
        crate::ir::infer::infer_graph(&mut self.graph)?;
        self.check_declared_outputs(gp)?;
        self.check_value_info(gp);
        Ok(self.graph)
    }

    fn add_initializers(&mut self, gp: &GraphProto) -> Result<()> {
        for t in &gp.initializer {
            let name = t.name.clone().unwrap_or_default();
            if name.is_empty() {
                return Err(self.err("an initializer has no name"));
            }
            if self.by_name.contains_key(&name) {
                return Err(self.err(format!("initializer '{name}' is defined twice")));
            }
            let tensor =
                tensor_from_proto(t, &self.base_dir).map_err(|e| self.err(format!("initializer '{name}': {e}")))?;
            let ty = ValueType::new(tensor.dtype(), crate::ir::dim::dims_of(tensor.shape()));
            let id = self.graph.add_value(name.clone(), Some(ty));
            self.graph.values[id].konst = Some(Arc::new(tensor));
            self.by_name.insert(name, id);
        }
        Ok(())
    }

    fn add_inputs(&mut self, gp: &GraphProto) -> Result<()> {
        for vi in &gp.input {
            let name = vi.name.clone().unwrap_or_default();
            if name.is_empty() {
                return Err(self.err("a graph input has no name"));
            }
            // Models before IR version 4 list every initializer as an input too; the initializer
            // provides the value, so it stays a constant.
            if self.by_name.contains_key(&name) {
                if self.graph.values[self.by_name[&name]].konst.is_some() {
                    continue;
                }
                return Err(self.err(format!("graph input '{name}' is listed twice")));
            }
            let ty = self.value_type(vi, "graph input")?;
            let id = self.graph.add_value(name.clone(), Some(ty));
            self.graph.inputs.push(id);
            self.by_name.insert(name, id);
        }
        Ok(())
    }

    fn value_type(&mut self, vi: &ValueInfoProto, what: &str) -> Result<ValueType> {
        let name = vi.name.as_deref().unwrap_or("");
        let tp = vi.r#type.as_ref().and_then(|t| t.value.as_ref());
        let tensor = match tp {
            Some(type_proto::Value::TensorType(t)) => t,
            Some(_) => {
                return Err(self.err(format!(
                "{what} '{name}' is not a dense tensor (sequence, map, optional and sparse types are not supported)"
            )))
            }
            None => return Err(self.err(format!("{what} '{name}' has no type"))),
        };
        let code = tensor.elem_type.unwrap_or(0);
        let dtype = DType::from_onnx(code).ok_or_else(|| {
            self.err(format!(
                "{what} '{name}' has element type {} ({code}), which is not supported",
                DType::onnx_code_name(code)
            ))
        })?;
        let shape = tensor
            .shape
            .as_ref()
            .ok_or_else(|| self.err(format!("{what} '{name}' has no shape (unknown rank is not supported)")))?;
        let mut dims = Vec::with_capacity(shape.dim.len());
        for d in &shape.dim {
            use super::proto::tensor_shape_proto::dimension::Value as V;
            dims.push(match &d.value {
                Some(V::DimValue(v)) if *v >= 0 => Dim::known(*v),
                Some(V::DimValue(v)) => return Err(self.err(format!("{what} '{name}' has negative dimension {v}"))),
                Some(V::DimParam(p)) if !p.is_empty() => Dim::sym(p.clone()),
                _ => {
                    self.fresh_dims += 1;
                    Dim::sym(format!("unk__{}", self.fresh_dims - 1))
                }
            });
        }
        Ok(ValueType::new(dtype, dims))
    }

    fn add_nodes(&mut self, gp: &GraphProto, opsets: &BTreeMap<String, i64>) -> Result<Vec<Node>> {
        let names = node_names(gp);
        let mut errors = Vec::new();
        // Outputs first: ONNX files are supposed to be sorted, but not all are.
        let mut outputs_of: Vec<Vec<ValueId>> = Vec::with_capacity(gp.node.len());
        for (node, name) in gp.node.iter().zip(&names) {
            let mut outs = Vec::new();
            for (k, out) in node.output.iter().enumerate() {
                let vname = if out.is_empty() { format!("{name}::unused_output_{k}") } else { out.clone() };
                if self.by_name.contains_key(&vname) {
                    return Err(
                        self.err(format!("value '{vname}' is defined twice (again as output {k} of node '{name}')"))
                    );
                }
                let id = self.graph.add_value(vname.clone(), None);
                self.by_name.insert(vname, id);
                outs.push(id);
            }
            outputs_of.push(outs);
        }
        let mut unsupported: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        let mut nodes = Vec::with_capacity(gp.node.len());
        for ((node, name), outputs) in gp.node.iter().zip(&names).zip(outputs_of) {
            let op_type = node.op_type.clone().unwrap_or_default();
            let domain = normalize_domain(node.domain.as_deref().unwrap_or("")).to_string();
            let node_err = |msg: String| Error::node(&self.src, name, &op_type, msg);
            if op_type.is_empty() {
                errors.push(node_err("the node has no op_type".into()));
                continue;
            }
            let mut inputs = Vec::with_capacity(node.input.len());
            for inp in &node.input {
                if inp.is_empty() {
                    inputs.push(None);
                } else if let Some(&id) = self.by_name.get(inp) {
                    inputs.push(Some(id));
                } else {
                    errors.push(node_err(format!(
                        "input '{inp}' is not produced by any node, initializer or graph input"
                    )));
                    inputs.push(None);
                }
            }
            let Some(spec) = registry().lookup(&domain, &op_type) else {
                unsupported.entry((domain.clone(), op_type.clone())).or_default().push(name.clone());
                continue;
            };
            let Some(&opset) = opsets.get(&domain) else {
                errors.push(node_err(format!("the model imports no opset for domain '{domain}'")));
                continue;
            };
            let mut attrs = Attributes::new();
            let mut attr_ok = true;
            for a in &node.attribute {
                let aname = a.name.clone().unwrap_or_default();
                match attr_from_proto(a, &self.base_dir) {
                    Ok(v) => {
                        if attrs.insert(aname.clone(), v).is_some() {
                            errors.push(node_err(format!("attribute '{aname}' is given twice")));
                            attr_ok = false;
                        }
                    }
                    Err(e) => {
                        errors.push(node_err(e));
                        attr_ok = false;
                    }
                }
            }
            if !attr_ok {
                continue;
            }
            let present: Vec<bool> = node.input.iter().map(|i| !i.is_empty()).collect();
            let ctx = NodeCtx {
                name,
                op_type: &op_type,
                domain: &domain,
                opset,
                attrs: &attrs,
                inputs_present: &present,
                num_outputs: node.output.len(),
            };
            match (spec.parse)(&ctx) {
                Ok(op) => {
                    nodes.push(Node { name: name.clone(), op_type: op_type.clone(), domain, op, inputs, outputs })
                }
                Err(e) => errors.push(node_err(e.0)),
            }
        }
        if !unsupported.is_empty() {
            let ops = unsupported
                .into_iter()
                .map(|((domain, op_type), nodes)| UnsupportedOp { domain, op_type, nodes })
                .collect();
            errors.insert(0, Error::Unsupported { path: self.src.clone(), ops });
        }
        if !errors.is_empty() {
            return Err(Error::from_many(errors));
        }
        Ok(nodes)
    }

    /// Kahn's algorithm, keeping file order among ready nodes; a cycle is an error naming its nodes.
    fn topo_sort(&self, nodes: Vec<Node>) -> Result<Vec<Node>> {
        let mut producer: BTreeMap<ValueId, usize> = BTreeMap::new();
        for (n, node) in nodes.iter().enumerate() {
            for &o in &node.outputs {
                producer.insert(o, n);
            }
        }
        let mut indegree = vec![0usize; nodes.len()];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
        for (n, node) in nodes.iter().enumerate() {
            let deps: BTreeSet<usize> = node.inputs.iter().flatten().filter_map(|v| producer.get(v).copied()).collect();
            indegree[n] = deps.len();
            for d in deps {
                users[d].push(n);
            }
        }
        let mut ready: BTreeSet<usize> = (0..nodes.len()).filter(|&n| indegree[n] == 0).collect();
        let mut order = Vec::with_capacity(nodes.len());
        while let Some(n) = ready.pop_first() {
            order.push(n);
            for &u in &users[n] {
                indegree[u] -= 1;
                if indegree[u] == 0 {
                    ready.insert(u);
                }
            }
        }
        if order.len() != nodes.len() {
            let stuck: Vec<&str> =
                (0..nodes.len()).filter(|n| indegree[*n] > 0).map(|n| nodes[n].name.as_str()).collect();
            return Err(self.err(format!("the graph has a cycle through node(s): {}", stuck.join(", "))));
        }
        let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
        Ok(order.into_iter().map(|n| slots[n].take().expect("each node placed once")).collect())
    }

    /// `value_info` is advisory in ONNX: inference recomputes every type, and a disagreement
    /// (usually a stale annotation left by an editing tool) becomes a warning, not an error.
    fn check_value_info(&mut self, gp: &GraphProto) {
        for vi in &gp.value_info {
            let name = vi.name.as_deref().unwrap_or("");
            let Some(&id) = self.by_name.get(name) else {
                self.graph.info.warnings.push(format!("value_info names '{name}', which no node produces"));
                continue;
            };
            let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
                continue;
            };
            let Some(inferred) = self.graph.values[id].ty.clone() else { continue };
            let dtype = DType::from_onnx(t.elem_type.unwrap_or(0));
            let dims: Option<Vec<Option<i64>>> = t.shape.as_ref().map(|s| {
                use super::proto::tensor_shape_proto::dimension::Value as V;
                s.dim
                    .iter()
                    .map(|d| match d.value {
                        Some(V::DimValue(v)) => Some(v),
                        _ => None,
                    })
                    .collect()
            });
            let dims_agree = dims.as_ref().is_none_or(|dims| {
                dims.len() == inferred.rank()
                    && dims.iter().zip(&inferred.shape).all(|(d, i)| match (d, i.as_known()) {
                        (Some(a), Some(b)) => *a == b,
                        _ => true,
                    })
            });
            if dtype.is_some_and(|d| d != inferred.dtype) || !dims_agree {
                let declared = dims.map_or("?".to_string(), |d| {
                    let parts: Vec<String> = d.iter().map(|x| x.map_or("?".to_string(), |v| v.to_string())).collect();
                    format!("[{}]", parts.join(","))
                });
                let dt = dtype.map_or("?", |d| d.name());
                self.graph.info.warnings.push(format!(
                    "value_info declares '{name}' as {dt}{declared}, but inference gives {inferred}; using the inferred type"
                ));
            }
        }
    }

    /// Declared output types must agree with inference (dtype, rank, known dims).
    fn check_declared_outputs(&mut self, gp: &GraphProto) -> Result<()> {
        for (vi, &id) in gp.output.iter().zip(&self.graph.outputs.clone()) {
            if vi.r#type.is_none() {
                continue;
            }
            // An output declared with an element type but no shape (common for data-dependent
            // outputs such as NonZero's) only constrains the dtype.
            if let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                if t.shape.is_none() {
                    let inferred = self.graph.ty(id).clone();
                    let code = t.elem_type.unwrap_or(0);
                    if DType::from_onnx(code) != Some(inferred.dtype) {
                        return Err(self.err(format!(
                            "graph output '{}' is declared {} but inference gives {inferred}",
                            self.graph.values[id].name,
                            DType::onnx_code_name(code)
                        )));
                    }
                    continue;
                }
            }
            let declared = self.value_type(vi, "graph output")?;
            let inferred = self.graph.ty(id).clone();
            let dims_agree = declared.rank() == inferred.rank()
                && declared.shape.iter().zip(&inferred.shape).all(|(d, i)| match (d.as_known(), i.as_known()) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                });
            if declared.dtype != inferred.dtype || !dims_agree {
                return Err(self.err(format!(
                    "graph output '{}' is declared {declared} but inference gives {inferred}",
                    self.graph.values[id].name
                )));
            }
        }
        Ok(())
    }
}
