"""Kernel files of your own: loading one into a Variant, checking it on the CPU, running it
under compute-sanitizer, scaffolding a new one, and the expressions its header may use."""
