//! AMI aliases (`al2023@latest`, `bottlerocket@v1.50.0`, `al2@v20251101`) turned into the SSM
//! parameters AWS publishes for the EKS-optimized images, one per architecture and variant, each
//! with the requirements of the instance types that image serves (arch; GPU or accelerator
//! variants only for types that have them). Pure; an alias Joist cannot resolve is an error naming
//! `spec.amiSelectorTerms[i].alias`.

use joist_messages::{
    apis::common::NodeSelectorRequirementWithMinValues,
    labels::{ARCH, aws},
    model::requirements::Operator,
};

/// One SSM parameter to read for an alias, and the instance types its image serves.
#[derive(Debug, Clone, PartialEq)]
pub struct AliasParameter {
    /// `/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/standard/recommended/image_id`.
    pub path: String,
    /// `amd64` or `arm64`, plus GPU or accelerator requirements for those variants.
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
}

/// Why an alias cannot be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct AliasError {
    /// The field, `spec.amiSelectorTerms[0].alias`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Which instance types an image variant serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// Neither GPUs nor accelerators.
    Standard,
    /// NVIDIA GPUs.
    Nvidia,
    /// AWS Neuron accelerators.
    Neuron,
}

impl Variant {
    fn requirements(self, arch: &str) -> Vec<NodeSelectorRequirementWithMinValues> {
        let mut requirements = vec![arch_requirement(arch)];
        let (gpu, accelerator) = match self {
            Self::Standard => (Operator::DoesNotExist, Operator::DoesNotExist),
            Self::Nvidia => (Operator::Exists, Operator::DoesNotExist),
            Self::Neuron => (Operator::DoesNotExist, Operator::Exists),
        };
        requirements.push(requirement(aws::INSTANCE_GPU_COUNT, gpu, Vec::new()));
        requirements.push(requirement(
            aws::INSTANCE_ACCELERATOR_COUNT,
            accelerator,
            Vec::new(),
        ));
        requirements
    }
}

fn requirement(key: &str, operator: Operator, values: Vec<String>) -> NodeSelectorRequirementWithMinValues {
    NodeSelectorRequirementWithMinValues {
        key: key.to_owned(),
        operator,
        values,
        min_values: None,
    }
}

/// The requirement an image of architecture `arch` (`amd64`, `arm64`) puts on instance types.
pub fn arch_requirement(arch: &str) -> NodeSelectorRequirementWithMinValues {
    requirement(ARCH, Operator::In, vec![arch.to_owned()])
}

/// The SSM parameters for `alias` (term `index`) on Kubernetes `kubernetes` (`1.35`).
pub fn parameters(alias: &str, index: usize, kubernetes: &str) -> Result<Vec<AliasParameter>, AliasError> {
    let error = |reason: String| AliasError {
        field: format!("spec.amiSelectorTerms[{index}].alias"),
        reason,
    };
    let (family, version) = alias
        .split_once('@')
        .ok_or_else(|| error(format!("{alias:?} is not family@version")))?;
    let latest = version == "latest";
    let eks = format!("/aws/service/eks/optimized-ami/{kubernetes}");
    let mut out = Vec::new();
    for (arch, ec2_arch) in [("amd64", "x86_64"), ("arm64", "arm64")] {
        match family {
            "al2023" => {
                for (variant, name) in [
                    (Variant::Standard, "standard"),
                    (Variant::Nvidia, "nvidia"),
                    (Variant::Neuron, "neuron"),
                ] {
                    let release = if latest {
                        "recommended".to_owned()
                    } else {
                        format!("amazon-eks-node-al2023-{ec2_arch}-{name}-{kubernetes}-{version}")
                    };
                    out.push(AliasParameter {
                        path: format!("{eks}/amazon-linux-2023/{ec2_arch}/{name}/{release}/image_id"),
                        requirements: variant.requirements(arch),
                    });
                }
            }
            "bottlerocket" => {
                for (variant, suffix) in [(Variant::Standard, ""), (Variant::Nvidia, "-nvidia")] {
                    let release = version.trim_start_matches('v');
                    let release = if latest { "latest" } else { release };
                    out.push(AliasParameter {
                        path: format!("/aws/service/bottlerocket/aws-k8s-{kubernetes}{suffix}/{ec2_arch}/{release}/image_id"),
                        requirements: variant.requirements(arch),
                    });
                }
            }
            "al2" => {
                let flavours: &[(Variant, &str)] = if arch == "amd64" {
                    &[(Variant::Standard, ""), (Variant::Nvidia, "-gpu")]
                } else {
                    &[(Variant::Standard, "-arm64")]
                };
                for &(variant, suffix) in flavours {
                    let release = if latest {
                        "recommended".to_owned()
                    } else {
                        format!("amazon-eks{suffix}-node-{kubernetes}-{version}")
                    };
                    out.push(AliasParameter {
                        path: format!("{eks}/amazon-linux-2{suffix}/{release}/image_id"),
                        requirements: variant.requirements(arch),
                    });
                }
            }
            "windows2019" | "windows2022" | "windows2025" => {
                return Err(error(format!("{family} nodes are not supported by Joist yet")));
            }
            other => return Err(error(format!("unknown AMI family {other:?}"))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(alias: &str) -> Vec<String> {
        parameters(alias, 0, "1.35")
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|p| p.path)
            .collect()
    }

    #[test]
    fn al2023_latest_reads_the_recommended_parameter_of_each_arch_and_variant() {
        let paths = paths("al2023@latest");
        assert_eq!(paths.len(), 6);
        assert_eq!(
            paths[0],
            "/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/standard/recommended/image_id"
        );
        assert!(
            paths.contains(
                &"/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/arm64/nvidia/recommended/image_id"
                    .to_owned()
            )
        );
    }

    #[test]
    fn pinned_versions_name_the_release() {
        assert!(paths("al2023@v20251101").contains(
            &"/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/arm64/standard/amazon-eks-node-al2023-arm64-standard-1.35-v20251101/image_id"
                .to_owned()
        ));
        assert_eq!(
            paths("bottlerocket@v1.50.0")[0],
            "/aws/service/bottlerocket/aws-k8s-1.35/x86_64/1.50.0/image_id"
        );
        assert_eq!(
            paths("al2@latest"),
            [
                "/aws/service/eks/optimized-ami/1.35/amazon-linux-2/recommended/image_id",
                "/aws/service/eks/optimized-ami/1.35/amazon-linux-2-gpu/recommended/image_id",
                "/aws/service/eks/optimized-ami/1.35/amazon-linux-2-arm64/recommended/image_id",
            ]
        );
    }

    #[test]
    fn standard_images_serve_only_types_without_gpus_or_accelerators() {
        let parameters = parameters("al2023@latest", 0, "1.35").unwrap_or_else(|e| panic!("{e}"));
        let standard = &parameters[0].requirements;
        assert_eq!(standard[0].values, ["amd64"]);
        assert_eq!(standard[1].operator, Operator::DoesNotExist);
        assert_eq!(
            parameters[1].requirements[1].operator,
            Operator::Exists,
            "nvidia serves GPU types"
        );
    }

    #[test]
    fn windows_is_refused_by_field() {
        let error = parameters("windows2022@latest", 2, "1.35").err();
        assert_eq!(
            error.map(|e| e.to_string()).as_deref(),
            Some("spec.amiSelectorTerms[2].alias: windows2022 nodes are not supported by Joist yet")
        );
    }
}
