//! Python reads our checkpoints: `safetensors.numpy.load_file` loads
//! `model.safetensors` and `optimizer.safetensors` with exactly the dtypes,
//! shapes and values we saved, and `sha256sum` agrees with every manifest hash.
//! A sharded checkpoint (format 2) loads through its index, and Hugging
//! Face's own sharded loader (`huggingface_hub.load_torch_model`, in the
//! project's `.venv` with torch) fills a torch module from it.
//!
//! Needs `python3` with `safetensors` and `numpy` (`pip install safetensors
//! numpy`; CI installs them). Without them the tests fail, unless
//! `REKINDLE_SKIP_PYTHON=1` outside CI, which turns them into a loud SKIPPED
//! (`support::requires`).

use crate::support;

use std::path::Path;
use std::process::Command;

use rekindle::checkpoint::{DType, HostTensor, MODEL_FILE, OPTIMIZER_FILE, Snapshot, TensorSet};
use serde_json::Value;

use support::{manifest_entries, temp_store};

/// Loads each file given as argument with `safetensors.numpy.load_file` and
/// prints, per tensor, numpy's dtype, the shape, the values and the raw
/// little-endian bytes; plus the metadata `safe_open` reports.
const LOAD_WITH_NUMPY: &str = r#"
import json, sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file
out = {}
for path in sys.argv[1:]:
    tensors = {}
    for name, arr in load_file(path).items():
        tensors[name] = {
            "dtype": str(arr.dtype),
            "shape": list(arr.shape),
            "values": arr.reshape(-1).tolist(),
            "hex": arr.astype(arr.dtype.newbyteorder("<")).tobytes().hex(),
        }
    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata()
    out[path] = {"tensors": tensors, "metadata": metadata}
print(json.dumps(out))
"#;

/// numpy has no bfloat16, so `safetensors.numpy` refuses BF16: read the file
/// by the format's definition instead (u64 header length, JSON header, data)
/// and widen each bf16 to the f32 with the same top 16 bits.
const READ_BF16_BY_SPEC: &str = r#"
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
out = {}
for name, info in header.items():
    if name == "__metadata__":
        continue
    start, end = info["data_offsets"]
    chunk = data[start:end]
    if info["dtype"] == "BF16":
        values = (np.frombuffer(chunk, dtype="<u2").astype("<u4") << 16).view("<f4")
    else:
        values = np.frombuffer(chunk, dtype="<f4")
    out[name] = {"dtype": info["dtype"], "shape": info["shape"], "values": values.tolist()}
print(json.dumps(out))
"#;

fn python_json(script: &str, args: &[&Path]) -> Value {
    let out = Command::new("python3").arg("-c").arg(script).args(args).output().expect("run python3");
    assert!(out.status.success(), "python3 failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("python printed JSON")
}

fn le_bytes<T: Copy, const N: usize>(values: &[T], to_le: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|v| to_le(*v)).collect()
}

fn tensor(dtype: DType, shape: &[usize], data: Vec<u8>) -> HostTensor {
    HostTensor::new(dtype, shape.to_vec(), data).unwrap()
}

fn f32s(shape: &[usize], values: &[f32]) -> HostTensor {
    HostTensor::from_f32(shape.to_vec(), values)
}

/// Tensors of every dtype numpy can hold, several shapes (a 0-d scalar
/// included), and awkward values: -0.0, a subnormal, extremes.
fn interop_snapshot() -> Snapshot {
    let mut model = TensorSet::new();
    model.insert(
        "w.matrix".into(),
        f32s(&[3, 4], &[0.1, -0.2, 0.3, 1e-30, -0.0, 1e-40, 3.4e38, -3.4e38, 1.0, 2.0, 3.0, 4.0]),
    );
    model.insert("w.vector".into(), f32s(&[5], &[1.5, -2.25, 1.0 / 3.0, std::f32::consts::PI, f32::MIN_POSITIVE]));
    model.insert("w.scalar".into(), f32s(&[], &[42.125]));
    model.insert("w.cube".into(), f32s(&[2, 3, 2], &(0..12).map(|i| i as f32 * 0.7 - 3.0).collect::<Vec<_>>()));
    model.insert(
        "w.half".into(),
        tensor(DType::F16, &[4], le_bytes(&[0x3c00u16, 0xc000, 0x3800, 0x7bff], u16::to_le_bytes)),
    );
    model.insert("w.i64".into(), tensor(DType::I64, &[3], le_bytes(&[i64::MIN, -1, i64::MAX], i64::to_le_bytes)));
    model.insert("w.f64".into(), tensor(DType::F64, &[2], le_bytes(&[0.1f64, -1e300], f64::to_le_bytes)));
    model.insert("w.u32".into(), tensor(DType::U32, &[2], le_bytes(&[0u32, u32::MAX], u32::to_le_bytes)));
    model.insert("w.u8".into(), tensor(DType::U8, &[2, 2], vec![0, 1, 128, 255]));

    let mut optimizer = TensorSet::new();
    optimizer.insert("w.matrix.exp_avg".into(), f32s(&[3, 4], &(0..12).map(|i| -(i as f32) / 7.0).collect::<Vec<_>>()));
    optimizer.insert(
        "w.matrix.exp_avg_sq".into(),
        f32s(&[3, 4], &(0..12).map(|i| (i * i) as f32 / 9.0).collect::<Vec<_>>()),
    );
    optimizer.insert("step".into(), tensor(DType::I64, &[1], 7i64.to_le_bytes().to_vec()));
    Snapshot { step: 7, model, optimizer, state: serde_json::json!({"step": 7}) }
}

fn numpy_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::F64 => "float64",
        DType::I64 => "int64",
        DType::U32 => "uint32",
        DType::U8 => "uint8",
        DType::BF16 => unreachable!("numpy has no bfloat16"),
    }
}

/// Compares what numpy loaded with what we saved: dtype, shape and raw bytes
/// always, and the decoded values exactly for f32 and i64.
fn assert_numpy_matches(file: &str, loaded: &Value, saved: &TensorSet) {
    let tensors = loaded["tensors"].as_object().unwrap();
    assert_eq!(tensors.keys().collect::<Vec<_>>(), saved.keys().collect::<Vec<_>>(), "{file}: tensor names");
    for (name, t) in saved {
        let got = &tensors[name];
        let ctx = format!("{file}: {name}");
        assert_eq!(got["dtype"], numpy_name(t.dtype), "{ctx}: dtype");
        let shape: Vec<usize> = serde_json::from_value(got["shape"].clone()).unwrap();
        assert_eq!(shape, t.shape, "{ctx}: shape");
        assert_eq!(got["hex"].as_str().unwrap(), hex::encode(&t.data), "{ctx}: bytes");
        let values = got["values"].as_array().unwrap();
        match t.dtype {
            DType::F32 => {
                let expected = t.to_f32().unwrap();
                assert_eq!(values.len(), expected.len(), "{ctx}");
                for (v, e) in values.iter().zip(&expected) {
                    // Python floats are f64; every f32 is exact in one. Compare bits (-0.0 too).
                    assert_eq!((v.as_f64().unwrap() as f32).to_bits(), e.to_bits(), "{ctx}: {v} != {e}");
                }
            }
            DType::I64 => {
                let expected: Vec<i64> =
                    t.data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
                let got: Vec<i64> = values.iter().map(|v| v.as_i64().unwrap()).collect();
                assert_eq!(got, expected, "{ctx}");
            }
            _ => {}
        }
    }
}

#[test]
fn numpy_loads_saved_tensors_with_identical_dtypes_shapes_and_values() {
    let Some(()) = support::requires::python() else { return };
    let (_tmp, store) = temp_store(3);
    let snapshot = interop_snapshot();
    store.save(&snapshot).unwrap();
    let dir = store.step_dir(snapshot.step);
    let (model, optimizer) = (dir.join(MODEL_FILE), dir.join(OPTIMIZER_FILE));

    let loaded = python_json(LOAD_WITH_NUMPY, &[&model, &optimizer]);
    let key = |p: &Path| p.to_str().unwrap().to_string();
    assert_numpy_matches(MODEL_FILE, &loaded[key(&model)], &snapshot.model);
    assert_numpy_matches(OPTIMIZER_FILE, &loaded[key(&optimizer)], &snapshot.optimizer);
    assert_eq!(
        loaded[key(&model)]["metadata"],
        serde_json::json!({"format": "pt", "writer": "rekindle", "content": "model", "step": "7"}),
        "safetensors metadata as Python sees it"
    );
    assert_eq!(loaded[key(&optimizer)]["metadata"]["content"], "optimizer");
}

#[test]
fn bf16_tensors_follow_the_safetensors_layout() {
    let Some(()) = support::requires::python() else { return };
    let (_tmp, store) = temp_store(3);
    let mut snapshot = interop_snapshot();
    // 1.0, -2.5, 0.15625, 3.0: bf16 is the top half of the f32 bit pattern.
    let bf16: Vec<u16> = [1.0f32, -2.5, 0.15625, 3.0].iter().map(|v| (v.to_bits() >> 16) as u16).collect();
    snapshot.model.clear();
    snapshot.model.insert("a.bf16".into(), tensor(DType::BF16, &[2, 2], le_bytes(&bf16, u16::to_le_bytes)));
    snapshot.model.insert("b.f32".into(), f32s(&[1], &[0.75]));
    store.save(&snapshot).unwrap();

    let read = python_json(READ_BF16_BY_SPEC, &[&store.step_dir(snapshot.step).join(MODEL_FILE)]);
    assert_eq!(read["a.bf16"]["dtype"], "BF16");
    assert_eq!(read["a.bf16"]["shape"], serde_json::json!([2, 2]));
    assert_eq!(read["a.bf16"]["values"], serde_json::json!([1.0, -2.5, 0.15625, 3.0]));
    assert_eq!(read["b.f32"]["values"], serde_json::json!([0.75]));
    // And our own reader returns the same bytes.
    let loaded = store.load_latest().unwrap().loaded.unwrap();
    assert_eq!(loaded.snapshot.model, snapshot.model);
}

#[test]
fn manifest_hashes_match_sha256sum() {
    let (_tmp, store) = temp_store(3);
    let snapshot = interop_snapshot();
    store.save(&snapshot).unwrap();
    let dir = store.step_dir(snapshot.step);
    let entries = manifest_entries(&dir);
    assert_eq!(entries.len(), 3, "{entries:?}");
    for entry in entries {
        let path = dir.join(&entry.name);
        let out = Command::new("sha256sum").arg(&path).output().expect("run sha256sum");
        assert!(out.status.success(), "sha256sum {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8(out.stdout).unwrap();
        let digest = stdout.split_whitespace().next().unwrap();
        assert_eq!(digest, entry.sha256, "{}", entry.name);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), entry.bytes, "{}", entry.name);
    }
}

/// Reads a sharded checkpoint the way Hugging Face's sharded loaders do
/// (`transformers`' `load_sharded_checkpoint`, `huggingface_hub`'s
/// `load_torch_model`): the index's `weight_map` names each tensor's shard,
/// each shard is loaded with `safetensors` on its own, and the tensors are
/// taken from the shard the index names. Prints, per stem, every tensor's
/// dtype, shape and bytes, the shards each was read from, and the index's
/// `total_size`.
const LOAD_SHARDED_LIKE_HF: &str = r#"
import json, os, sys
from safetensors.numpy import load_file
d = sys.argv[1]
out = {}
for stem in ("model", "optimizer"):
    index = json.load(open(os.path.join(d, stem + ".safetensors.index.json")))
    shards = sorted(set(index["weight_map"].values()))
    loaded = {shard: load_file(os.path.join(d, shard)) for shard in shards}
    tensors = {}
    for name, shard in index["weight_map"].items():
        arr = loaded[shard][name]
        tensors[name] = {"dtype": str(arr.dtype), "shape": list(arr.shape), "hex": arr.tobytes().hex(), "shard": shard}
    held = sorted(n for shard in loaded.values() for n in shard)
    out[stem] = {"tensors": tensors, "shards": shards, "total_size": index["metadata"]["total_size"], "held": held}
print(json.dumps(out))
"#;

#[test]
fn a_sharded_checkpoint_reads_whole_through_its_index_and_file_by_file_with_safetensors() {
    let Some(()) = support::requires::python() else { return };
    let (tmp, store) = temp_store(3);
    // 64-byte shards: the model's nine tensors and the optimizer's three
    // are cut into several files each.
    let settings = rekindle::checkpoint::WriteSettings { shard_bytes: Some(64), ..Default::default() };
    let store = store.with_write_settings(settings);
    let snapshot = interop_snapshot();
    store.save(&snapshot).unwrap();
    let dir = store.step_dir(snapshot.step);
    let names: Vec<String> = manifest_entries(&dir).into_iter().map(|e| e.name).collect();
    assert!(names.contains(&"model.safetensors.index.json".to_string()), "{names:?}");
    assert!(!names.contains(&MODEL_FILE.to_string()) && !names.contains(&OPTIMIZER_FILE.to_string()), "{names:?}");

    let read = python_json(LOAD_SHARDED_LIKE_HF, &[&dir]);
    for (stem, saved) in [("model", &snapshot.model), ("optimizer", &snapshot.optimizer)] {
        let got = &read[stem];
        let shards: Vec<String> = serde_json::from_value(got["shards"].clone()).unwrap();
        assert!(shards.len() > 1, "{stem} is in shards: {shards:?}");
        assert!(shards.iter().all(|s| names.contains(s)), "every shard is in the manifest: {shards:?}");
        let held: Vec<String> = serde_json::from_value(got["held"].clone()).unwrap();
        assert_eq!(held, saved.keys().cloned().collect::<Vec<_>>(), "{stem}: each tensor in exactly one shard");
        let total: u64 = saved.values().map(|t| t.data.len() as u64).sum();
        assert_eq!(got["total_size"], total, "{stem}: the index's total_size");
        for (name, t) in saved {
            let tensor = &got["tensors"][name];
            assert_eq!(tensor["dtype"], numpy_name(t.dtype), "{stem}.{name}");
            let shape: Vec<usize> = serde_json::from_value(tensor["shape"].clone()).unwrap();
            assert_eq!(shape, t.shape, "{stem}.{name}");
            assert_eq!(tensor["hex"].as_str().unwrap(), hex::encode(&t.data), "{stem}.{name}: bytes");
        }
    }
    // Every file's hash is what the manifest says, and rekindle verifies
    // and loads it back whole.
    let verified = support::runs::rekindle().arg("verify").arg(&dir).output().unwrap();
    assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stdout));
    assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot, snapshot);
    drop(tmp);
}

/// A model and optimizer named as a PyTorch module's state dict is
/// (`layers.0.mlp.weight`, `….exp_avg`), in the dtypes torch users keep,
/// bfloat16 included (numpy has none, torch has).
fn torch_like_snapshot() -> Snapshot {
    let mut snapshot = interop_snapshot();
    let mut model = TensorSet::new();
    let ramp = |n: usize, scale: f32| (0..n).map(|i| i as f32 * scale - 1.0).collect::<Vec<_>>();
    model.insert("embed.weight".into(), f32s(&[4, 3], &ramp(12, 0.25)));
    let bf16 = |v: &[f32]| v.iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect::<Vec<u8>>();
    model.insert("layers.0.mlp.weight".into(), tensor(DType::BF16, &[3, 3], bf16(&ramp(9, 0.5))));
    model.insert(
        "layers.0.norm.weight".into(),
        tensor(DType::F16, &[3], le_bytes(&[0x3c00u16, 0xc000, 0x7bff], u16::to_le_bytes)),
    );
    model.insert("layers.1.mlp.weight".into(), f32s(&[3, 3], &ramp(9, -0.125)));
    model.insert("head.bias".into(), tensor(DType::F64, &[2], le_bytes(&[0.1f64, -1e300], f64::to_le_bytes)));
    model.insert("head.tokens_seen".into(), tensor(DType::I64, &[], i64::MAX.to_le_bytes().to_vec()));
    model.insert("mask".into(), tensor(DType::U8, &[2, 2], vec![0, 1, 128, 255]));
    let mut optimizer = TensorSet::new();
    for (name, t) in &model {
        if matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
            optimizer.insert(format!("{name}.exp_avg"), t.clone());
        }
    }
    optimizer.insert("step".into(), tensor(DType::I64, &[1], 7i64.to_le_bytes().to_vec()));
    (snapshot.model, snapshot.optimizer) = (model, optimizer);
    snapshot
}

/// Builds a `torch.nn.Module` whose parameters have the names, dtypes and
/// shapes of the checkpoint's tensors (all zeros, as a user's freshly made
/// model), fills it with Hugging Face's own sharded loader
/// (`huggingface_hub.load_torch_model`, strict: every key once, no key
/// missing) from the directory, once for `model` and once for `optimizer`,
/// and prints every tensor's raw bytes.
const LOAD_WITH_HF_HUB: &str = r#"
import json, os, sys
import torch
from huggingface_hub import load_torch_model
from safetensors import safe_open
d = sys.argv[1]
out = {}
for stem in ("model", "optimizer"):
    index = json.load(open(os.path.join(d, stem + ".safetensors.index.json")))
    root = torch.nn.Module()
    for name, shard in index["weight_map"].items():
        with safe_open(os.path.join(d, shard), framework="pt") as f:
            like = f.get_tensor(name)
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        module.register_buffer(leaf, torch.zeros_like(like))
    result = load_torch_model(root, d, strict=True, filename_pattern=stem + "{suffix}.safetensors")
    state = root.state_dict()
    out[stem] = {
        "missing": list(result.missing_keys), "unexpected": list(result.unexpected_keys),
        "hex": {k: v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex() for k, v in state.items()},
    }
print(json.dumps(out))
"#;

#[test]
fn hugging_face_hubs_sharded_loader_fills_a_torch_module_from_a_sharded_checkpoint() {
    let Some(python) = support::requires::hf_hub() else { return };
    let (tmp, store) = temp_store(3);
    let settings = rekindle::checkpoint::WriteSettings { shard_bytes: Some(64), ..Default::default() };
    let store = store.with_write_settings(settings);
    let snapshot = torch_like_snapshot();
    store.save(&snapshot).unwrap();
    let dir = store.step_dir(snapshot.step);
    let out = Command::new(&python).arg("-c").arg(LOAD_WITH_HF_HUB).arg(&dir).output().expect("run the venv's python");
    assert!(out.status.success(), "huggingface_hub failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let read: Value = serde_json::from_slice(&out.stdout).expect("python printed JSON");
    for (stem, saved) in [("model", &snapshot.model), ("optimizer", &snapshot.optimizer)] {
        let got = &read[stem];
        assert_eq!(got["missing"], serde_json::json!([]), "{stem}: keys the loader did not fill");
        assert_eq!(got["unexpected"], serde_json::json!([]), "{stem}: keys the module does not have");
        let hex = got["hex"].as_object().expect("hex per tensor");
        assert_eq!(hex.len(), saved.len(), "{stem}: tensors loaded");
        for (name, t) in saved {
            assert_eq!(hex[name].as_str().unwrap(), hex::encode(&t.data), "{stem}.{name}: bytes");
        }
    }
    drop(tmp);
}
