#!/usr/bin/env python3
"""Generate the simulated cloud's instance-type catalog from moto's EC2 data.

The simulated provider offers the instance types of a real cloud (AWS EC2) so that
scheduling and bin-packing decisions are made against realistic shapes: vCPU and memory
sizes, ENI and IP limits, bandwidths, local NVMe, GPUs and zone availability. That data is
taken from the EC2 resource files the PyPI package `moto` ships (a recorded
DescribeInstanceTypes response and DescribeInstanceTypeOfferings per availability zone), so
the catalog can be regenerated offline, with nothing but Python 3 and moto installed:

    pip install moto==5.2.1
    pip download moto==5.1.0 --no-deps -d /tmp/moto-5.1.0
    providers/sim/scripts/generate-catalog.py --retired /tmp/moto-5.1.0/moto-5.1.0-py3-none-any.whl [OUTPUT]

OUTPUT defaults to providers/sim/data/instance-types.json next to this script's folder.

moto 5.2.1 no longer lists some types AWS still sells and prices (p2, p3, f1, the u-*tb1
high-memory types, i3.metal). `--retired WHEEL` takes those from an older moto release's wheel
(5.1.0): a type the older data lists and the installed moto does not is added, with the older
data's shape and zones.

Inputs, located through the installed moto package:
  moto/ec2/resources/instance_types.json.gz
      instance type name -> DescribeInstanceTypes item
  moto/ec2/resources/instance_type_offerings/availability-zone/<region>.json.gz
      list of {"InstanceType": ..., "Location": <zone>}

A type is kept when it supports hvm virtualization, runs x86_64 or arm64, and is offered in
at least one zone of the catalog's regions (us-east-1, us-east-2, us-west-2, eu-west-1). The output is
deterministic: types sorted by name, keys in a fixed order, no timestamps, one instance type
per line so that a regeneration diffs line by line.
"""

import argparse
import gzip
import importlib.util
import io
import json
import os
import sys
import zipfile

REGIONS = ("us-east-1", "us-east-2", "us-west-2", "eu-west-1")
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


def directory_reader(resources):
    """A reader of moto's gzipped resource files (paths relative to ec2/resources) in a folder."""

    def read(relative):
        with gzip.open(os.path.join(resources, relative), "rt", encoding="utf-8") as f:
            return json.load(f)

    return read


def wheel_reader(wheel):
    """(moto version, a reader of moto's resource files) inside a moto wheel."""
    archive = zipfile.ZipFile(wheel)
    version = os.path.basename(wheel).split("-")[1]

    def read(relative):
        data = archive.read("moto/ec2/resources/" + relative)
        with gzip.open(io.BytesIO(data), "rt", encoding="utf-8") as f:
            return json.load(f)

    return version, read


def zone_offerings(read):
    """instance type -> {region: sorted zones} for the catalog's regions."""
    zones = {}
    for region in REGIONS:
        path = "instance_type_offerings/availability-zone/" + region + ".json.gz"
        for offering in read(path):
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


def efa_interfaces(network):
    if not network.get("EfaSupported"):
        return 0
    return int((network.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0))


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
        "networkCards": int(network.get("MaximumNetworkCards", 1)),
        "efaInterfaces": efa_interfaces(network),
        "zones": zones,
    }


def build(read, retired=None):
    """The catalog from moto's data, with the types only `retired` (an older reader) lists."""
    types = {name: (item, read) for name, item in read("instance_types.json.gz").items()}
    if retired is not None:
        for name, item in retired("instance_types.json.gz").items():
            types.setdefault(name, (item, retired))
    offered = {id(read): zone_offerings(read)}
    if retired is not None:
        offered[id(retired)] = zone_offerings(retired)
    catalog = []
    for name in sorted(types):
        item, source = types[name]
        if "hvm" not in item.get("SupportedVirtualizationTypes", []):
            continue
        if arch_of(item) is None:
            continue
        zones = offered[id(source)].get(name)
        if not zones:
            continue
        catalog.append(entry(name, item, zones))
    return catalog


def render(moto_version, retired_version, catalog):
    source = (
        "moto %s ec2/resources (instance_types.json.gz, "
        "instance_type_offerings/availability-zone)" % moto_version
    )
    if retired_version:
        source += "; types it no longer lists from moto %s's" % retired_version
    lines = ["{", '  "source": %s,' % json.dumps(source), '  "instanceTypes": [']
    rows = [json.dumps(t, separators=(",", ":"), ensure_ascii=True) for t in catalog]
    lines.extend("    " + row + ("," if i + 1 < len(rows) else "") for i, row in enumerate(rows))
    lines.extend(["  ]", "}"])
    return "\n".join(lines) + "\n"


def main(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--retired", metavar="WHEEL", help="an older moto wheel (see above)")
    parser.add_argument("output", nargs="?", default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv[1:])
    output = args.output
    moto_version, resources = moto_resources()
    retired_version, retired = wheel_reader(args.retired) if args.retired else (None, None)
    catalog = build(directory_reader(resources), retired)
    text = render(moto_version, retired_version, catalog)
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
