//! Inputs users have (issue 16, point 4): `validate` takes `.npy`/`.npz` files of any dtype numpy
//! writes when it converts exactly (a float16 file for a float16 input), and Reduce*/Squeeze/
//! Unsqueeze take their `axes` as graph inputs, read at run time by the reference executor and
//! checked against ONNX Runtime. Code generation still needs those axes at compile time and says
//! so, as `onnx2ait ops` states.
//!
//! Models are written here with the crate's protobuf types; the `.npy` files by hand, byte for
//! byte as numpy writes them.

use onnx2ait::onnx::proto::{
    self, tensor_shape_proto::dimension::Value as DimValue, type_proto, AttributeProto, GraphProto, ModelProto,
    NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use onnx2ait::validate::inputs::{InputOptions, InputSource};
use onnx2ait::validate::{validate, Options, Report};
use prost::Message;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

const FLOAT: i32 = 1;
const INT64: i32 = 7;
const FLOAT16: i32 = 10;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("onnx2ait-runtime-inputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A tensor value; `dims` None leaves the shape out (outputs whose shape depends on the axes).
fn value(name: &str, elem_type: i32, dims: Option<&[i64]>) -> ValueInfoProto {
    let shape = dims.map(|dims| TensorShapeProto {
        dim: dims
            .iter()
            .map(|&d| proto::tensor_shape_proto::Dimension { value: Some(DimValue::DimValue(d)), ..Default::default() })
            .collect(),
    });
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(elem_type), shape })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto { name: Some(name.into()), i: Some(v), r#type: Some(2), ..Default::default() }
}

fn node(op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("{op}_{}", outputs[0])),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn write_model(path: &Path, nodes: Vec<NodeProto>, inputs: Vec<ValueInfoProto>, outputs: Vec<ValueInfoProto>) {
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(18) }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: nodes,
            input: inputs,
            output: outputs,
            ..Default::default()
        }),
        ..Default::default()
    };
    std::fs::write(path, m.encode_to_vec()).unwrap();
}

/// A `.npy` file (format 1.0) as numpy writes it, for little-endian element bytes.
fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn i64_npy(v: &[i64]) -> Vec<u8> {
    npy("<i8", &[v.len()], &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

fn run(model: &Path, files: &[(&str, &Path)]) -> Report {
    let opts = Options {
        inputs: InputOptions {
            seed: 3,
            files: files.iter().map(|(n, p)| (n.to_string(), p.to_path_buf())).collect(),
            dims: BTreeMap::new(),
        },
        ..Default::default()
    };
    let report = validate(model, &opts).unwrap_or_else(|e| panic!("validate {}: {e}", model.display()));
    assert!(report.passed(), "{report}");
    report
}

fn output_shape(report: &Report, name: &str) -> Vec<usize> {
    let v = serde_json::to_value(report).unwrap();
    let outs = v["outputs"].as_array().expect("outputs");
    let o = outs.iter().find(|o| o["name"] == name).unwrap_or_else(|| panic!("no output {name}: {v}"));
    serde_json::from_value(o["shape"].clone()).unwrap_or_else(|e| panic!("output {name} shape: {e}: {o}"))
}

/// The report from issue 16: a float16 `.npy` for a float16 input was refused ("needs float32").
#[test]
fn float16_npy_and_npz_feed_a_float16_input() {
    let dir = scratch("f16");
    let model = dir.join("cast.onnx");
    write_model(
        &model,
        vec![node("Cast", &["x"], &["y"], vec![int_attr("to", FLOAT as i64)])],
        vec![value("x", FLOAT16, Some(&[2, 3]))],
        vec![value("y", FLOAT, Some(&[2, 3]))],
    );
    let values = [0.5f32, -1.25, 3.0, 1024.0, -0.0009765625, 65504.0];
    let bytes: Vec<u8> = values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
    let x = dir.join("x.npy");
    std::fs::write(&x, npy("<f2", &[2, 3], &bytes)).unwrap();
    let report = run(&model, &[("x", &x)]);
    assert_eq!(report.inputs[0].source, InputSource::File(x.display().to_string()));
    assert_eq!(report.inputs[0].dtype, "float16");

    // The same array in a compressed archive (np.savez_compressed(f, x=...)).
    let npz = dir.join("inputs.npz");
    let mut z = zip::ZipWriter::new(std::fs::File::create(&npz).unwrap());
    let deflated = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    z.start_file("x.npy", deflated).unwrap();
    z.write_all(&npy("<f2", &[2, 3], &bytes)).unwrap();
    z.finish().unwrap();
    run(&model, &[("x", &npz)]);

    // A float32 file whose values are not float16 numbers is refused, naming the value.
    let f32s: Vec<u8> = [0.1f32, 0.0, 0.0, 0.0, 0.0, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let bad = dir.join("bad.npy");
    std::fs::write(&bad, npy("<f4", &[2, 3], &f32s)).unwrap();
    let opts = Options {
        inputs: InputOptions { files: BTreeMap::from([("x".to_string(), bad.clone())]), ..Default::default() },
        ..Default::default()
    };
    let e = validate(&model, &opts).unwrap_err().to_string();
    assert!(e.contains("not exactly a float16") && e.contains(".astype(np.float16)"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Reduce*, Squeeze and Unsqueeze with `axes` as graph inputs: the reference executor reads them
/// at run time and agrees with ONNX Runtime on values and shapes.
#[test]
fn reduce_squeeze_unsqueeze_axes_from_graph_inputs() {
    let dir = scratch("axes");
    let model = dir.join("axes.onnx");
    write_model(
        &model,
        vec![
            node("ReduceSum", &["x", "sum_axes"], &["sum"], vec![]),
            node("ReduceMax", &["x", "max_axes"], &["max"], vec![int_attr("keepdims", 0)]),
            node("ReduceMean", &["x", "mean_axes"], &["mean"], vec![int_attr("keepdims", 0)]),
            node("Squeeze", &["sum", "sq_axes"], &["squeezed"], vec![]),
            node("Unsqueeze", &["max", "unsq_axes"], &["unsqueezed"], vec![]),
        ],
        vec![
            value("x", FLOAT, Some(&[2, 3, 4])),
            value("sum_axes", INT64, Some(&[1])),
            value("max_axes", INT64, Some(&[2])),
            value("mean_axes", INT64, Some(&[0])),
            value("sq_axes", INT64, Some(&[1])),
            value("unsq_axes", INT64, Some(&[2])),
        ],
        vec![
            value("sum", FLOAT, None),
            value("max", FLOAT, None),
            value("mean", FLOAT, None),
            value("squeezed", FLOAT, None),
            value("unsqueezed", FLOAT, None),
        ],
    );
    let file = |name: &str, v: &[i64]| {
        let p = dir.join(format!("{name}.npy"));
        std::fs::write(&p, i64_npy(v)).unwrap();
        p
    };
    let cases: [(&[i64], &[i64], &[i64], &[i64], [&[usize]; 5]); 2] = [
        // sum over the last axis (kept as 1), max over 0 and 2, mean with empty axes (over all),
        // squeeze that 1, unsqueeze at the front and back.
        (&[-1], &[0, 2], &[-1], &[0, -1], [&[2, 3, 1], &[3], &[], &[2, 3], &[1, 3, 1]]),
        (&[1], &[2, 1], &[-2], &[1, 2], [&[2, 1, 4], &[2], &[], &[2, 4], &[2, 1, 1]]),
    ];
    for (sum_axes, max_axes, sq_axes, unsq_axes, shapes) in cases {
        let files = [
            ("sum_axes", file("sum_axes", sum_axes)),
            ("max_axes", file("max_axes", max_axes)),
            ("mean_axes", file("mean_axes", &[])),
            ("sq_axes", file("sq_axes", sq_axes)),
            ("unsq_axes", file("unsq_axes", unsq_axes)),
        ];
        let files: Vec<(&str, &Path)> = files.iter().map(|(n, p)| (*n, p.as_path())).collect();
        let report = run(&model, &files);
        for (name, shape) in ["sum", "max", "mean", "squeezed", "unsqueezed"].iter().zip(shapes) {
            assert_eq!(output_shape(&report, name), shape, "output {name} for axes {sum_axes:?}/{max_axes:?}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Resize with `scales` (and, for tf_crop_and_resize, `roi`) as graph inputs.
#[test]
fn resize_scales_and_roi_from_graph_inputs() {
    let dir = scratch("resize");
    let model = dir.join("resize.onnx");
    let mode = |m: &str| AttributeProto {
        name: Some("coordinate_transformation_mode".into()),
        s: Some(m.as_bytes().to_vec()),
        r#type: Some(3),
        ..Default::default()
    };
    write_model(
        &model,
        vec![
            node("Resize", &["x", "", "scales"], &["y"], vec![]),
            node("Resize", &["x", "roi", "scales"], &["crop"], vec![mode("tf_crop_and_resize")]),
        ],
        vec![
            value("x", FLOAT, Some(&[1, 2, 3, 4])),
            value("roi", FLOAT, Some(&[8])),
            value("scales", FLOAT, Some(&[4])),
        ],
        vec![value("y", FLOAT, None), value("crop", FLOAT, None)],
    );
    let f32_file = |name: &str, v: &[f32]| {
        let p = dir.join(format!("{name}.npy"));
        std::fs::write(&p, npy("<f4", &[v.len()], &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()))
            .unwrap();
        p
    };
    let roi = f32_file("roi", &[0.0, 0.0, 0.25, 0.0, 1.0, 1.0, 0.75, 1.0]);
    for (scales, shape) in [([1.0f32, 1.0, 2.0, 0.5], [1usize, 2, 6, 2]), ([1.0, 1.0, 2.0, 3.0], [1, 2, 6, 12])] {
        let scales = f32_file("scales", &scales);
        let report = run(&model, &[("roi", &roi), ("scales", &scales)]);
        assert_eq!(output_shape(&report, "y"), shape);
        assert_eq!(output_shape(&report, "crop"), shape);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Pad (opset 11+) with `pads` and `constant_value` as graph inputs.
#[test]
fn pad_pads_from_a_graph_input() {
    let dir = scratch("pad");
    let model = dir.join("pad.onnx");
    write_model(
        &model,
        vec![node("Pad", &["x", "pads"], &["y"], vec![])],
        vec![value("x", FLOAT, Some(&[2, 3])), value("pads", INT64, Some(&[4]))],
        vec![value("y", FLOAT, None)],
    );
    let pads = dir.join("pads.npy");
    for (p, shape) in [([1i64, 0, 0, 2], [3usize, 5]), ([0, -1, 2, 1], [4, 3])] {
        std::fs::write(&pads, i64_npy(&p)).unwrap();
        let report = run(&model, &[("pads", pads.as_path())]);
        assert_eq!(output_shape(&report, "y"), shape, "pads {p:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `onnx2ait ops` states what code generation still needs for these ops.
#[test]
fn ops_states_the_run_time_input_restriction() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_onnx2ait")).args(["ops", "--json"]).output().unwrap();
    assert!(out.status.success());
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    for op in ["ReduceSum", "ReduceMean", "Squeeze", "Unsqueeze", "Resize", "Pad"] {
        let row = rows.iter().find(|r| r["op_type"] == op).unwrap_or_else(|| panic!("{op} missing"));
        let note = row["note"].as_str().unwrap_or_else(|| panic!("{op} has no note: {row}"));
        assert!(note.contains("run-time value") && note.contains("code generation"), "{op}: {note}");
    }
    assert!(rows.iter().find(|r| r["op_type"] == "Conv").unwrap().get("note").is_none());
}
