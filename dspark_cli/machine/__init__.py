"""This machine, as every stage uses it: its devices, its CPU, the child processes a stage starts.

    from dspark_cli.machine.devices import visible_gpus, producer_environ   # GPUs, producer / trainer split
    from dspark_cli.machine.cpu import keep_freed_memory, bind_threads      # CPU memory and threads
    from dspark_cli.machine.procs import dies_with_parent, cpu_engine_defaults   # children, vLLM on CPU
    from dspark_cli.machine.facts import Machine                            # what the preflight asks

- devices.py  GPUs visible without starting CUDA; which devices producers and trainer ranks take;
- cpu.py      CPU training's host settings: freed memory kept, OpenMP threads pinned;
- procs.py    child processes that die with their parent; every vllm.LLM's CPU settings;
- facts.py    `Machine`: visible GPUs and installed packages, detected once (or described).

Import-light: nothing here imports torch or vllm at import time.
"""
