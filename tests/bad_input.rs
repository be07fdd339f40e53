//! Bad input never panics: each malformed model gives an error naming the file and, where one is
//! involved, the node and op — and the CLI exits non-zero (tests/cli.rs covers exit codes).

use onnx2ait::onnx::proto::{
    self, tensor_shape_proto::dimension::Value as DimValue, type_proto, AttributeProto, GraphProto, ModelProto,
    NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use onnx2ait::onnx::{load_model, ModelFile};
use prost::Message;
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("onnx2ait-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    let shape = TensorShapeProto {
        dim: dims
            .iter()
            .map(|&d| proto::tensor_shape_proto::Dimension { value: Some(DimValue::DimValue(d)), ..Default::default() })
            .collect(),
    };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(1), shape: Some(shape) })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn model(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: nodes,
            input: inputs,
            output: outputs,
            initializer: inits,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn write(name: &str, m: &ModelProto) -> PathBuf {
    let p = tmp(name);
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    p
}

/// Loads and returns the error text, asserting it names the file.
fn error_of(path: &Path) -> String {
    let err = load_model(path).expect_err("malformed model must be rejected").to_string();
    assert!(err.contains(&path.display().to_string()), "error does not name the file: {err}");
    err
}

fn relu_model() -> ModelProto {
    model(
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![value_info("x", &[2, 3])],
        vec![value_info("y", &[2, 3])],
        vec![],
    )
}

#[test]
fn a_well_formed_model_loads() {
    let g = load_model(&write("ok.onnx", &relu_model())).expect("valid model");
    assert_eq!(g.nodes.len(), 1);
}

#[test]
fn truncated_file() {
    let bytes = relu_model().encode_to_vec();
    for cut in [1, bytes.len() / 2, bytes.len() - 1] {
        let p = tmp(&format!("truncated_{cut}.onnx"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let e = error_of(&p);
        assert!(
            e.contains("not a valid ONNX model")
                || e.contains("no graph")
                || e.contains("no outputs")
                || e.contains("empty"),
            "{e}"
        );
    }
}

#[test]
fn random_bytes_and_empty_file() {
    let p = tmp("random.onnx");
    let mut x: u64 = 0x9E3779B97F4A7C15;
    let bytes: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&p, bytes).unwrap();
    error_of(&p);
    let e = tmp("empty.onnx");
    std::fs::write(&e, b"").unwrap();
    assert!(error_of(&e).contains("empty"));
    let missing = tmp("does-not-exist.onnx");
    assert!(error_of(&missing).contains("cannot open"));
}

#[test]
fn empty_graph() {
    let m = model(vec![], vec![value_info("x", &[1])], vec![value_info("x", &[1])], vec![]);
    assert!(error_of(&write("empty_graph.onnx", &m)).contains("graph is empty"));
}

#[test]
fn missing_initializer_and_dangling_input() {
    // "w" is neither an initializer nor an input nor produced by a node.
    let m = model(
        vec![node("Add", "add0", &["x", "w"], &["y"], vec![])],
        vec![value_info("x", &[2, 3])],
        vec![value_info("y", &[2, 3])],
        vec![],
    );
    let e = error_of(&write("missing_init.onnx", &m));
    assert!(e.contains("node 'add0' (Add)") && e.contains("input 'w' is not produced"), "{e}");
}

#[test]
fn dangling_graph_output() {
    let mut m = relu_model();
    m.graph.as_mut().unwrap().output = vec![value_info("nowhere", &[2, 3])];
    assert!(error_of(&write("dangling_output.onnx", &m)).contains("graph output 'nowhere'"));
}

#[test]
fn cycle() {
    let m = model(
        vec![node("Add", "a", &["x", "c"], &["b"], vec![]), node("Relu", "r", &["b"], &["c"], vec![])],
        vec![value_info("x", &[2])],
        vec![value_info("c", &[2])],
        vec![],
    );
    let e = error_of(&write("cycle.onnx", &m));
    assert!(e.contains("cycle") && e.contains('a') && e.contains('r'), "{e}");
}

#[test]
fn wrong_attribute_type() {
    let axis_as_float =
        AttributeProto { name: Some("axis".into()), r#type: Some(1), f: Some(1.0), ..Default::default() };
    let m = model(
        vec![node("Softmax", "sm", &["x"], &["y"], vec![axis_as_float])],
        vec![value_info("x", &[2, 3])],
        vec![value_info("y", &[2, 3])],
        vec![],
    );
    let e = error_of(&write("wrong_attr.onnx", &m));
    assert!(e.contains("node 'sm' (Softmax)") && e.contains("'axis'") && e.contains("INT"), "{e}");
}

#[test]
fn unknown_ops_are_all_reported_at_once() {
    let m = model(
        vec![
            node("FrobnicateA", "f1", &["x"], &["a"], vec![]),
            node("Relu", "r", &["a"], &["b"], vec![]),
            node("FrobnicateB", "f2", &["b"], &["c"], vec![]),
            node("FrobnicateA", "f3", &["c"], &["y"], vec![]),
        ],
        vec![value_info("x", &[2])],
        vec![value_info("y", &[2])],
        vec![],
    );
    let p = write("unknown_op.onnx", &m);
    let e = error_of(&p);
    assert!(e.contains("2 unsupported op type(s)"), "{e}");
    assert!(e.contains("FrobnicateA (2 node(s): f1, f3)") && e.contains("FrobnicateB (1 node(s): f2)"), "{e}");
    let listed = ModelFile::open(&p).unwrap().unsupported_ops();
    assert_eq!(listed.len(), 2);
}

#[test]
fn shape_mismatch() {
    let m = model(
        vec![node("Add", "add_bad", &["x", "z"], &["y"], vec![])],
        vec![value_info("x", &[2, 3]), value_info("z", &[4])],
        vec![value_info("y", &[2, 3])],
        vec![],
    );
    let e = error_of(&write("shape_mismatch.onnx", &m));
    assert!(e.contains("node 'add_bad' (Add)") && e.contains("[2,3] and [4]"), "{e}");
}

#[test]
fn initializer_with_wrong_size() {
    let w = TensorProto {
        name: Some("w".into()),
        data_type: Some(1),
        dims: vec![2, 3],
        float_data: vec![1.0; 5],
        ..Default::default()
    };
    let m = model(
        vec![node("Add", "add0", &["x", "w"], &["y"], vec![])],
        vec![value_info("x", &[2, 3])],
        vec![value_info("y", &[2, 3])],
        vec![w],
    );
    let e = error_of(&write("bad_init.onnx", &m));
    assert!(e.contains("initializer 'w'") && e.contains("float_data has 5 values"), "{e}");
}

#[test]
fn value_defined_twice() {
    let m = model(
        vec![node("Relu", "r1", &["x"], &["y"], vec![]), node("Relu", "r2", &["x"], &["y"], vec![])],
        vec![value_info("x", &[2])],
        vec![value_info("y", &[2])],
        vec![],
    );
    assert!(error_of(&write("twice.onnx", &m)).contains("defined twice"));
}

#[test]
fn declared_output_type_must_match() {
    let mut m = relu_model();
    m.graph.as_mut().unwrap().output = vec![value_info("y", &[3, 2])];
    assert!(error_of(&write("declared.onnx", &m)).contains("declared"));
}

#[test]
fn stale_value_info_is_a_warning_not_an_error() {
    let mut m = model(
        vec![node("Relu", "r1", &["x"], &["h"], vec![]), node("Relu", "r2", &["h"], &["y"], vec![])],
        vec![value_info("x", &[2, 3])],
        vec![value_info("y", &[2, 3])],
        vec![],
    );
    m.graph.as_mut().unwrap().value_info = vec![value_info("h", &[5])];
    let g = load_model(&write("stale_value_info.onnx", &m)).expect("value_info is advisory");
    assert_eq!(g.info.warnings.len(), 1, "{:?}", g.info.warnings);
    assert!(g.info.warnings[0].contains("'h'") && g.info.warnings[0].contains("float32[2,3]"), "{:?}", g.info.warnings);
}
