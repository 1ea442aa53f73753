#!/usr/bin/env python3
"""Generate the simulated cloud's instance-type catalog from moto's EC2 data.

The simulated provider offers the instance types of a real cloud (AWS EC2) so that
scheduling and bin-packing decisions are made against realistic shapes: vCPU and memory
sizes, ENI and IP limits, bandwidths, local NVMe, GPUs and zone availability. That data is
taken from the EC2 resource files the PyPI package `moto` ships (a recorded
DescribeInstanceTypes response and DescribeInstanceTypeOfferings per availability zone), so
the catalog can be regenerated offline, with nothing but Python 3 and moto installed:

    pip install moto==5.2.1
    providers/sim/scripts/generate-catalog.py [OUTPUT]

OUTPUT defaults to providers/sim/data/instance-types.json next to this script's folder.

Inputs, located through the installed moto package:
  moto/ec2/resources/instance_types.json.gz
      instance type name -> DescribeInstanceTypes item
  moto/ec2/resources/instance_type_offerings/availability-zone/<region>.json.gz
      list of {"InstanceType": ..., "Location": <zone>}

A type is kept when it supports hvm virtualization, runs x86_64 or arm64, and is offered in
at least one zone of the catalog's regions (us-east-1, us-west-2). The output is
deterministic: types sorted by name, keys in a fixed order, no timestamps, one instance type
per line so that a regeneration diffs line by line.
"""

import gzip
import importlib.util
import json
import os
import sys

REGIONS = ("us-east-1", "us-west-2")
ARCHES = {"x86_64": "amd64", "arm64": "arm64"}

DEFAULT_OUTPUT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "instance-types.json"
)


def moto_resources():
    """Return (moto version, path of moto/ec2/resources) without importing all of moto."""
    spec = importlib.util.find_spec("moto")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("generate-catalog: the Python package 'moto' is not installed (pip install moto)")
    root = list(spec.submodule_search_locations)[0]
    try:
        from importlib.metadata import version

        moto_version = version("moto")
    except Exception:  # metadata missing: fall back to the package attribute
        import moto

        moto_version = moto.__version__
    return moto_version, os.path.join(root, "ec2", "resources")


def load_gz_json(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def zone_offerings(resources):
    """instance type -> {region: sorted zones} for the catalog's regions."""
    zones = {}
    for region in REGIONS:
        path = os.path.join(
            resources, "instance_type_offerings", "availability-zone", region + ".json.gz"
        )
        for offering in load_gz_json(path):
            by_region = zones.setdefault(offering["InstanceType"], {})
            by_region.setdefault(region, set()).add(offering["Location"])
    return {
        name: {region: sorted(by_region[region]) for region in REGIONS if region in by_region}
        for name, by_region in zones.items()
    }


def arch_of(item):
    for arch in item.get("ProcessorInfo", {}).get("SupportedArchitectures", []):
        if arch in ARCHES:
            return ARCHES[arch]
    return None


def default_network_card(network):
    cards = network.get("NetworkCards") or []
    index = network.get("DefaultNetworkCardIndex", 0)
    for card in cards:
        if card.get("NetworkCardIndex") == index:
            return card
    return cards[0] if cards else {}


def local_nvme_gb(item):
    storage = item.get("InstanceStorageInfo") or {}
    if storage.get("NvmeSupport") in ("required", "supported"):
        return int(storage.get("TotalSizeInGB") or 0)
    return 0


def gpu_of(item):
    gpus = (item.get("GpuInfo") or {}).get("Gpus") or []
    if not gpus:
        return None
    gpu = gpus[0]
    return {
        "name": str(gpu.get("Name", "")).lower(),
        "manufacturer": str(gpu.get("Manufacturer", "")).lower(),
        "count": int(gpu.get("Count", 0)),
        "memoryMiB": int((gpu.get("MemoryInfo") or {}).get("SizeInMiB", 0)),
    }


def entry(name, item, zones):
    processor = item.get("ProcessorInfo", {})
    network = item.get("NetworkInfo", {})
    clock = processor.get("SustainedClockSpeedInGhz")
    bandwidth = default_network_card(network).get("BaselineBandwidthInGbps")
    ebs = (item.get("EbsInfo") or {}).get("EbsOptimizedInfo") or {}
    return {
        "name": name,
        "vcpus": int(item["VCpuInfo"]["DefaultVCpus"]),
        "memoryMiB": int(item["MemoryInfo"]["SizeInMiB"]),
        "arch": arch_of(item),
        "hypervisor": item.get("Hypervisor", ""),
        "cpuManufacturer": str(processor.get("Manufacturer", "")).lower(),
        "clockMhz": int(round(clock * 1000)) if clock else 0,
        "maxEnis": int(network.get("MaximumNetworkInterfaces", 0)),
        "ipv4PerEni": int(network.get("Ipv4AddressesPerInterface", 0)),
        "networkBandwidthMbps": int(round(bandwidth * 1000)) if bandwidth else 0,
        "ebsBandwidthMbps": int(ebs.get("MaximumBandwidthInMbps", 0)),
        "localNvmeGb": local_nvme_gb(item),
        "bareMetal": bool(item.get("BareMetal", False)),
        "encryptionInTransit": bool(network.get("EncryptionInTransitSupported", False)),
        "gpu": gpu_of(item),
        "zones": zones,
    }


def build(resources):
    types = load_gz_json(os.path.join(resources, "instance_types.json.gz"))
    offered = zone_offerings(resources)
    catalog = []
    for name in sorted(types):
        item = types[name]
        if "hvm" not in item.get("SupportedVirtualizationTypes", []):
            continue
        if arch_of(item) is None:
            continue
        zones = offered.get(name)
        if not zones:
            continue
        catalog.append(entry(name, item, zones))
    return catalog


def render(moto_version, catalog):
    source = (
        "moto %s ec2/resources (instance_types.json.gz, "
        "instance_type_offerings/availability-zone)" % moto_version
    )
    lines = ["{", '  "source": %s,' % json.dumps(source), '  "instanceTypes": [']
    rows = [json.dumps(t, separators=(",", ":"), ensure_ascii=True) for t in catalog]
    lines.extend("    " + row + ("," if i + 1 < len(rows) else "") for i, row in enumerate(rows))
    lines.extend(["  ]", "}"])
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) > 2:
        print("usage: generate-catalog.py [OUTPUT]", file=sys.stderr)
        return 2
    output = argv[1] if len(argv) == 2 else DEFAULT_OUTPUT
    moto_version, resources = moto_resources()
    catalog = build(resources)
    text = render(moto_version, catalog)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    tmp = output + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, output)
    print(
        "generate-catalog: wrote %d instance types to %s" % (len(catalog), output),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
