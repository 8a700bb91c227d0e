"""`sieverag filter list | install | package`: the trained filters sieverag can find."""

from __future__ import annotations

import argparse

from sieverag.inference.filters.adapters import DEFAULT_FILTER_NAME, read_card


def _held_out_f1(card: dict | None) -> str:
    chunk = ((card or {}).get("held_out") or {}).get("chunk") or {}
    top = next((figures for method, figures in chunk.items()
                if method.startswith("trained filter top-")), None)
    return "–" if not top or top.get("f1") is None else f"{top['f1']:.3f}"


def cmd_list(args: argparse.Namespace) -> int:
    from sieverag.inference.filters.adapters import adapters_dir, available_adapters

    found = available_adapters()
    if not found:
        print(f"no filter adapters found (cache: {adapters_dir()})")
        return 0
    print(f"{'name':24} {'source':8} {'by name':9} {'base model':24} {'held-out F1':11} path")
    for adapter, picked in found:
        card = read_card(adapter.path)
        base = (card or {}).get("base_model", "–")
        print(f"{adapter.name:24} {adapter.source:8} {'yes' if picked else 'shadowed':9} "
              f"{base:24} {_held_out_f1(card):11} {adapter.path}")
    print(f"\nA name is looked up in the cache ({adapters_dir()}) first, then among the "
          f"shipped filters; MCF uses {DEFAULT_FILTER_NAME!r} unless given another.")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    from sieverag.inference.filters.adapters import install_adapter

    target = install_adapter(args.path, args.name)
    print(f"installed {args.path} as {target.name!r}: {target}")
    return 0


def cmd_package(args: argparse.Namespace) -> int:
    from sieverag.inference.filters.packaging import package_filter

    packaged = package_filter(args.run_dir, args.out, name=args.name, eval_dir=args.eval_filter,
                              check_passages=args.check_passages)
    print(f"packaged {args.run_dir} as {args.name!r} in {packaged.folder}: weights "
          f"{packaged.weights_bytes:,} bytes (bfloat16); P(Yes) of the bf16 adapter within "
          f"{packaged.max_p_yes_diff:.2e} of the float32 one on {packaged.passages_checked} "
          "passages")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `filter` (list, install, package) to the `sieverag` command line."""
    parser = subparsers.add_parser(
        "filter", help="list, install or package trained filter adapters",
        description="Trained filter adapters: a folder path, a name in the cache, or a filter "
                    "shipped with sieverag.")
    sub = parser.add_subparsers(dest="filter_command", required=True, metavar="ACTION")

    listing = sub.add_parser("list", help="show the filters found by name, and where")
    listing.set_defaults(func=cmd_list)

    install = sub.add_parser("install", help="copy an adapter into the cache (checked first)",
                             description="Copy an adapter's files (adapter_config.json, "
                             "adapter_model.safetensors, sieverag_adapter.json) into "
                             "$SIEVERAG_CACHE/adapters/NAME after checking them. Installed as "
                             f"{DEFAULT_FILTER_NAME!r}, a retrained filter replaces the "
                             "shipped one everywhere.")
    install.add_argument("path", metavar="PATH", help="adapter folder (e.g. a training output)")
    install.add_argument("--name", help="name in the cache (default: the folder's name)")
    install.set_defaults(func=cmd_install)

    package = sub.add_parser(
        "package", help="make a shippable filter (bf16 weights + card) from a training run",
        description="Write the adapter of a training output folder as a shippable filter: "
                    "bf16 weights (checked against the float32 ones), a config naming the base "
                    "model publicly, and a card with the base weights' and prompt templates' "
                    "sha256, the training data, the recipe and the held-out quality.")
    package.add_argument("run_dir", metavar="RUN_DIR", help="output folder of training.sft")
    package.add_argument("--out", required=True,
                         help="folder to write (e.g. inference/filters/shipped/smollm2-filter)")
    package.add_argument("--name", default=DEFAULT_FILTER_NAME,
                         help=f"the filter's name (default {DEFAULT_FILTER_NAME})")
    package.add_argument("--eval-filter", metavar="DIR",
                         help="an eval-filter --out folder whose figures go into the card")
    package.add_argument("--check-passages", type=int, default=200,
                         help="validation passages scored by both the bf16 and float32 "
                              "adapters (default 200)")
    package.set_defaults(func=cmd_package)
