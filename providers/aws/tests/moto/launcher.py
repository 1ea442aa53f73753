"""Starts moto (the AWS API emulator) on 127.0.0.1 for Joist's AWS tests.

moto lacks the SSM parameters AWS publishes for the EKS-optimized and Bottlerocket AMIs, and it
refuses PutParameter under /aws/ as AWS does. This launcher registers one image per family,
architecture and variant, seeds the parameters that point at them straight into moto's SSM
backend, prints one line `ready PORT`, and serves until its standard input closes: the test
process that started it exited, so the server never outlives its tests.

Usage: python launcher.py --region us-west-2 --kubernetes-version 1.35
"""

import argparse
import datetime
import sys

from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from moto.server import ThreadedMotoServer
from moto.ssm.models import Parameter, ssm_backends

# The release every seeded AMI claims to be, as Karpenter's pinned aliases name it.
RELEASE = "v20251101"
BOTTLEROCKET_VERSION = "1.50.0"
# The account AWS publishes EKS AMIs from in most regions.
AMAZON_OWNER = "602401143452"


def images(kubernetes):
    """(image name, architecture, SSM parameter paths) for every alias family Joist resolves."""
    eks = f"/aws/service/eks/optimized-ami/{kubernetes}"
    for arch, short in (("x86_64", "x86_64"), ("arm64", "arm64")):
        for variant in ("standard", "nvidia", "neuron"):
            name = f"amazon-eks-node-al2023-{short}-{variant}-{kubernetes}-{RELEASE}"
            base = f"{eks}/amazon-linux-2023/{short}/{variant}"
            yield name, arch, [f"{base}/recommended/image_id", f"{base}/{name}/image_id"]
        for flavour in ("", "-nvidia"):
            name = f"bottlerocket-aws-k8s-{kubernetes}{flavour}-{short}-v{BOTTLEROCKET_VERSION}"
            base = f"/aws/service/bottlerocket/aws-k8s-{kubernetes}{flavour}/{short}"
            yield name, arch, [f"{base}/latest/image_id", f"{base}/{BOTTLEROCKET_VERSION}/image_id"]
    for suffix, arch in (("", "x86_64"), ("-arm64", "arm64"), ("-gpu", "x86_64")):
        name = f"amazon-eks{suffix}-node-{kubernetes}-{RELEASE}"
        base = f"{eks}/amazon-linux-2{suffix}"
        yield name, arch, [f"{base}/recommended/image_id", f"{base}/{name}/image_id"]


def seed(region, kubernetes):
    # moto's RegisterImage keeps only the name; the architecture is set on the image itself.
    amis = ec2_backends[DEFAULT_ACCOUNT_ID][region]
    parameters = ssm_backends[DEFAULT_ACCOUNT_ID][region]._parameters
    now = datetime.datetime.now(datetime.timezone.utc)
    for name, arch, paths in images(kubernetes):
        image = amis.register_image(name=name, description=f"{name} (seeded for Joist's tests)")
        image.architecture = arch
        image.owner_id = AMAZON_OWNER
        for path in paths:
            parameters[path].append(
                Parameter(
                    account_id=DEFAULT_ACCOUNT_ID,
                    name=path,
                    value=image.id,
                    parameter_type="String",
                    description=None,
                    allowed_pattern=None,
                    keyid=None,
                    last_modified_date=now,
                    version=1,
                    data_type="aws:ec2:image",
                )
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--region", default="us-west-2")
    parser.add_argument("--kubernetes-version", default="1.35")
    args = parser.parse_args()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    seed(args.region, args.kubernetes_version)
    print(f"ready {port}", flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
