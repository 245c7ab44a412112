//! peft LoRA adapters (`adapter_config.json` + `adapter_model.safetensors`, as `taskfleet
//! finetune` writes them) merged into the base weights at load: `W += scale * B @ A` with
//! `scale = lora_alpha / r` (`/ sqrt(r)` with rsLoRA). Merged weights compute what peft's
//! unmerged forward computes, up to float rounding. Options that would change that maths
//! (DoRA, trained biases, saved modules, fan-in-fan-out layouts, per-module ranks) are refused.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::error::Result;
use crate::protocol::Code;
use crate::runtime::failure;

#[derive(Debug, Deserialize)]
struct AdapterConfig {
    #[serde(default)]
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f64,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    bias: Option<String>,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    rank_pattern: HashMap<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: HashMap<String, serde_json::Value>,
}

fn load_failed(message: String) -> crate::error::Error {
    failure(Code::LoadFailed, message)
}

impl AdapterConfig {
    fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            load_failed(format!(
                "not a peft adapter folder ({}: {e})",
                path.display()
            ))
        })?;
        let config: AdapterConfig = serde_json::from_str(&text)
            .map_err(|e| load_failed(format!("{}: {e}", path.display())))?;
        let mut unsupported = Vec::new();
        if config.peft_type.as_deref().is_some_and(|t| t != "LORA") {
            unsupported.push(format!("peft_type {:?}", config.peft_type));
        }
        if config.use_dora {
            unsupported.push("use_dora".into());
        }
        if config.fan_in_fan_out {
            unsupported.push("fan_in_fan_out".into());
        }
        if config.bias.as_deref().is_some_and(|b| b != "none") {
            unsupported.push(format!("bias {:?}", config.bias));
        }
        if config
            .modules_to_save
            .as_ref()
            .is_some_and(|m| !m.is_empty())
        {
            unsupported.push("modules_to_save".into());
        }
        if !config.rank_pattern.is_empty() || !config.alpha_pattern.is_empty() {
            unsupported.push("rank_pattern/alpha_pattern".into());
        }
        if config.r == 0 {
            unsupported.push("r = 0".into());
        }
        if !unsupported.is_empty() {
            return Err(load_failed(format!(
                "adapter {} uses {} which the candle runtime does not merge",
                dir.display(),
                unsupported.join(", ")
            )));
        }
        Ok(config)
    }

    fn scale(&self) -> f64 {
        if self.use_rslora {
            self.lora_alpha / (self.r as f64).sqrt()
        } else {
            self.lora_alpha / self.r as f64
        }
    }
}

/// Merges the adapter in `dir` into `weights` (the base's tensors by name), in place.
/// Returns the number of merged layers.
pub fn merge(weights: &mut HashMap<String, Tensor>, dir: &Path, device: &Device) -> Result<usize> {
    let config = AdapterConfig::read(dir)?;
    let path = dir.join("adapter_model.safetensors");
    let adapter = candle_core::safetensors::load(&path, device)
        .map_err(|e| load_failed(format!("cannot read {}: {e}", path.display())))?;
    let mut pairs: HashMap<String, (Option<Tensor>, Option<Tensor>)> = HashMap::new();
    for (name, tensor) in adapter {
        let module = name.strip_prefix("base_model.model.").unwrap_or(&name);
        let (module, slot) = if let Some(m) = module.strip_suffix(".lora_A.weight") {
            (m, 0)
        } else if let Some(m) = module.strip_suffix(".lora_B.weight") {
            (m, 1)
        } else {
            return Err(load_failed(format!(
                "adapter tensor {name:?} is not a LoRA A/B weight; the candle runtime merges \
                 only linear LoRA layers"
            )));
        };
        let entry = pairs.entry(module.to_string()).or_default();
        if slot == 0 {
            entry.0 = Some(tensor);
        } else {
            entry.1 = Some(tensor);
        }
    }
    let scale = config.scale();
    let mut merged = 0;
    for (module, pair) in pairs {
        let (Some(a), Some(b)) = pair else {
            return Err(load_failed(format!(
                "adapter layer {module} lacks its lora_A or lora_B weight"
            )));
        };
        let Some(key) = base_key(weights, &module) else {
            if module.starts_with("pooler.") || module.contains(".pooler.") {
                continue; // the pooler takes no part in sentence embeddings
            }
            return Err(load_failed(format!(
                "the adapter changes {module}, which the base model does not have"
            )));
        };
        let base = &weights[&key];
        let delta = (b.to_dtype(DType::F32)?.matmul(&a.to_dtype(DType::F32)?)? * scale)?;
        if delta.dims() != base.dims() {
            return Err(load_failed(format!(
                "adapter layer {module} is {:?} but the base weight is {:?}",
                delta.dims(),
                base.dims()
            )));
        }
        let updated = (base.to_dtype(DType::F32)? + delta)?.to_dtype(base.dtype())?;
        weights.insert(key, updated);
        merged += 1;
    }
    Ok(merged)
}

/// The base tensor a LoRA module name targets, with or without the `bert.` prefix.
fn base_key(weights: &HashMap<String, Tensor>, module: &str) -> Option<String> {
    let candidates = [
        format!("{module}.weight"),
        format!("bert.{module}.weight"),
        module
            .strip_prefix("bert.")
            .map(|m| format!("{m}.weight"))
            .unwrap_or_default(),
    ];
    candidates.into_iter().find(|k| weights.contains_key(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(dir: &Path, config: &str, tensors: &[(&str, Tensor)]) {
        std::fs::write(dir.join("adapter_config.json"), config).unwrap();
        let map: HashMap<String, Tensor> = tensors
            .iter()
            .map(|(k, t)| (k.to_string(), t.clone()))
            .collect();
        candle_core::safetensors::save(&map, dir.join("adapter_model.safetensors")).unwrap();
    }

    #[test]
    fn merge_adds_scaled_b_times_a() {
        let device = Device::Cpu;
        let dir = tempfile::tempdir().unwrap();
        // W is 2x3; r = 1; alpha = 2 -> scale 2.
        let a = Tensor::new(&[[1f32, 2., 3.]], &device).unwrap();
        let b = Tensor::new(&[[1f32], [-1.]], &device).unwrap();
        save(
            dir.path(),
            r#"{"peft_type": "LORA", "r": 1, "lora_alpha": 2, "bias": "none"}"#,
            &[
                ("base_model.model.encoder.q.lora_A.weight", a),
                ("base_model.model.encoder.q.lora_B.weight", b),
            ],
        );
        let mut weights = HashMap::new();
        weights.insert(
            "encoder.q.weight".to_string(),
            Tensor::zeros((2, 3), DType::F32, &device).unwrap(),
        );
        assert_eq!(merge(&mut weights, dir.path(), &device).unwrap(), 1);
        let merged: Vec<Vec<f32>> = weights["encoder.q.weight"].to_vec2().unwrap();
        assert_eq!(merged, vec![vec![2., 4., 6.], vec![-2., -4., -6.]]);
    }

    #[test]
    fn refuses_what_it_would_get_wrong() {
        let device = Device::Cpu;
        let dir = tempfile::tempdir().unwrap();
        let a = Tensor::zeros((1, 3), DType::F32, &device).unwrap();
        let b = Tensor::zeros((2, 1), DType::F32, &device).unwrap();
        let tensors = [
            ("base_model.model.encoder.q.lora_A.weight", a),
            ("base_model.model.encoder.q.lora_B.weight", b),
        ];
        let mut weights = HashMap::new();
        weights.insert(
            "encoder.q.weight".to_string(),
            Tensor::zeros((2, 3), DType::F32, &device).unwrap(),
        );
        for config in [
            r#"{"r": 1, "lora_alpha": 2, "use_dora": true}"#,
            r#"{"r": 1, "lora_alpha": 2, "bias": "all"}"#,
            r#"{"r": 1, "lora_alpha": 2, "modules_to_save": ["classifier"]}"#,
        ] {
            save(dir.path(), config, &tensors);
            assert!(
                merge(&mut weights, dir.path(), &device).is_err(),
                "{config}"
            );
        }
        save(dir.path(), r#"{"r": 1, "lora_alpha": 2}"#, &tensors);
        let mut other = HashMap::new();
        other.insert(
            "encoder.k.weight".to_string(),
            Tensor::zeros((2, 3), DType::F32, &device).unwrap(),
        );
        assert!(merge(&mut other, dir.path(), &device).is_err());
    }
}
