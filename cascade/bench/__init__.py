"""Every benchmark, each a ``cascade bench <name>`` subcommand whose flags are its settings
class: ``compare`` (every method side by side), ``step`` (the verify engine's step),
``load`` (the services under load and over a slow link), ``reliability`` (faults under load),
``drafting`` (drafting methods on their workloads); ``machine``, ``measure``, ``prompts`` and
``output`` serve them all."""
