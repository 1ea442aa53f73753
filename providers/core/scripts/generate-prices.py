#!/usr/bin/env python3
"""Generate Joist's built-in on-demand price table from the AWS Price List figures.

Every provider starts from this table: the simulated cloud sells at its prices, and the AWS
provider orders offerings by them until the Price List API answers. The input is the committed
figure file next to the output (data/ec2-on-demand-us-east-1.tsv): one line per instance type,
`<type>\\t<usd per hour>`, the on-demand Linux rate in us-east-1 with shared tenancy and no
pre-installed software, as the public AWS Price List publishes it; its `#` header lines name the
publication date. To refresh it, export the same columns from the Price List offer file
(https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/us-east-1/index.json:
products with operatingSystem Linux, tenancy Shared, preInstalledSw NA, capacitystatus Used,
and their OnDemand priceDimensions) and run:

    providers/core/scripts/generate-prices.py [FIGURES.tsv] [OUTPUT.json]

Only us-east-1 figures are recorded; Joist charges the us-east-1 rate in any other region (AWS
prices most current families identically in us-east-1, us-east-2 and us-west-2).

Spot is a model, not a quote: each family carries `spotDiscount`, the share of the on-demand
price its spot offerings save. A family already in the output keeps its discount (they were
set by hand from typical spot savings); a new family gets the discount of its generation, the
first digit of its name (see GENERATION_DISCOUNT), because newer generations are discounted less.

The output is deterministic (families sorted, one family per line) so a regeneration diffs
line by line. Nothing but Python 3 is needed.
"""

import json
import os
import re
import sys

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
DEFAULT_FIGURES = os.path.join(DATA, "ec2-on-demand-us-east-1.tsv")
DEFAULT_OUTPUT = os.path.join(DATA, "on-demand-prices.json")
REGION = "us-east-1"

# Typical spot savings by generation, from the hand-set discounts of the families in the first
# table (5th generation about 64 %, 6th about 61 %, 7th about 57 %).
GENERATION_DISCOUNT = {1: 0.70, 2: 0.70, 3: 0.70, 4: 0.68, 5: 0.64, 6: 0.60, 7: 0.56}
NEWEST_DISCOUNT = 0.52

SPOT_NOTE = (
    "spotDiscount is a modelled per-family discount off the on-demand price, not a quoted spot "
    "price: a type's simulated spot price is its on-demand price times (1 - spotDiscount), e.g. "
    "0.62 means spot costs 38% of on-demand."
)


def fail(message):
    sys.exit("generate-prices: " + message)


def read_figures(path):
    """(header lines, {instance type: usd per hour}) from a figure file."""
    header, prices = [], {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if line.startswith("#"):
                header.append(line.lstrip("# ").strip())
                continue
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2 or "." not in fields[0]:
                fail("%s:%d: expected '<type>\\t<usd per hour>', got %r" % (path, number, line))
            try:
                price = float(fields[1])
            except ValueError:
                fail("%s:%d: %r is not a price" % (path, number, fields[1]))
            if price <= 0:
                fail("%s:%d: %s costs %s" % (path, number, fields[0], fields[1]))
            if fields[0] in prices:
                fail("%s:%d: %s is listed twice" % (path, number, fields[0]))
            prices[fields[0]] = price
    dates = [d for h in header for d in re.findall(r"\d{4}-\d{2}-\d{2}", h)]
    if not dates:
        fail("%s: no header line says when the figures were published (YYYY-MM-DD)" % path)
    return dates[0], prices


def generation_discount(family):
    digits = re.search(r"\d", family)
    if digits is None:
        return NEWEST_DISCOUNT
    return GENERATION_DISCOUNT.get(int(digits.group()), NEWEST_DISCOUNT)


def existing_discounts(path):
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    return {name: family["spotDiscount"] for name, family in table["families"].items()}


def build(prices, discounts):
    families = {}
    for instance_type in sorted(prices):
        family = instance_type.split(".", 1)[0]
        families.setdefault(family, {})[instance_type] = prices[instance_type]
    return {
        family: {
            "spotDiscount": discounts.get(family, generation_discount(family)),
            "prices": {REGION: by_type},
        }
        for family, by_type in families.items()
    }


def render(source, families):
    lines = [
        "{",
        '  "currency": "USD",',
        '  "unit": "hour",',
        '  "source": %s,' % json.dumps(source),
        '  "otherRegions": "priced at the us-east-1 rate",',
        '  "spotNote": %s,' % json.dumps(SPOT_NOTE),
        '  "families": {',
    ]
    rows = [
        "    %s: %s" % (json.dumps(name), json.dumps(family, separators=(",", ":"), sort_keys=True))
        for name, family in sorted(families.items())
    ]
    lines.extend(row + ("," if i + 1 < len(rows) else "") for i, row in enumerate(rows))
    lines.extend(["  }", "}"])
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) > 3:
        print("usage: generate-prices.py [FIGURES.tsv] [OUTPUT.json]", file=sys.stderr)
        return 2
    figures = argv[1] if len(argv) > 1 else DEFAULT_FIGURES
    output = argv[2] if len(argv) > 2 else DEFAULT_OUTPUT
    published, prices = read_figures(figures)
    source = "AWS Price List, %s, on-demand Linux, shared tenancy, published %s" % (REGION, published)
    families = build(prices, existing_discounts(output))
    tmp = output + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(render(source, families))
    os.replace(tmp, output)
    print(
        "generate-prices: wrote %d instance types in %d families to %s"
        % (len(prices), len(families), output),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
