"""The deliberate faults of `python -m tools.mutants` (issue 32): one row per fault a real bug
could be, each with the tests that must catch it.

A row: id, file, the exact text the fault replaces (it must occur once in the file), the text
that replaces it, the pytest node ids or paths (plus an optional -k) that must fail, and why the
fault matters. Rows named ``wt-*`` stand for one weakened test of issue 32 each: the fault its
strengthened test exists to catch. Rows with ``needs_gpu`` are listed, never run here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    id: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str
    k: str | None = None  # pytest -k expression narrowing ``tests``
    needs_gpu: bool = False


LC = "tests/lifecycle/"
PF = "tests/preflight/"

FAULTS: tuple[Fault, ...] = (
    # -- the route's lifecycle: what `up` accepts as "the route is on" --
    Fault(
        "up-no-expected-layers",
        "qpnserve/lifecycle/up.py",
        "reports, tp=opts.tp, expected_layers=expected, server_pids=server_pids",
        "reports, tp=opts.tp, expected_layers=None, server_pids=server_pids",
        (LC + "test_up_route_reports.py",),
        "the survivor of 9f67897: a rank reporting 3 of 4 layers would be accepted",
    ),
    Fault(
        "ranks-disagree-on-layers",
        "qpnserve/lifecycle/route_check.py",
        "if len(set(counts.values())) > 1:",
        "if len(set(counts.values())) > 2:",
        (LC + "test_route_check.py",),
        "ranks seeing different MoE layer counts means a layer went unseen on one of them",
    ),
    Fault(
        "status-route-line",
        "qpnserve/lifecycle/route_check.py",
        'head = f"{admitted}/{total} layers admitted on {ranks_ok}/{self.tp} ranks"',
        'head = f"{total}/{total} layers admitted on {ranks_ok}/{self.tp} ranks"',
        (LC + "test_route_check.py", LC + "test_status_route_values.py"),
        "status would claim every layer admitted while one is refused",
    ),
    Fault(
        "graph-fires-without-1-row",
        "qpnserve/lifecycle/route_check.py",
        "if rows[0] != 1:",
        "if 1 > rows[-1]:",
        (LC + "test_route_graphs.py",),
        "a server that captured no 1-token graph would not be told apart (the route cannot fire)",
    ),
    # -- the plugin's admission and init contract (contract sections 3 and 5) --
    Fault(
        "admit-two-rows",
        "qpnserve/dispatch/contract.py",
        "        if tuple(tensor.shape) != shape:",
        "        if tuple(tensor.shape)[1:] != shape[1:]:",
        ("tests/dispatch/test_admission.py",),
        "a 2-token batch through the M=1 operator computes one row and drops the other",
    ),
    Fault(
        "admit-int64-ids",
        "qpnserve/dispatch/contract.py",
        '("topk_ids", topk_ids, (1, TOP_K), torch.int32),',
        '("topk_ids", topk_ids, (1, TOP_K), topk_ids.dtype),',
        ("tests/dispatch/test_admission.py",),
        "int64 ids read as int32 pairs route to the wrong experts",
    ),
    Fault(
        "admit-strided-x",
        "qpnserve/dispatch/contract.py",
        "        if not tensor.is_contiguous():\n",
        '        if not tensor.is_contiguous() and name != "x":\n',
        ("tests/dispatch/test_admission.py",),
        "the operator reads x as dense: a strided view gives wrong activations",
    ),
    Fault(
        "init-w13-n-160",
        "qpnserve/dispatch/contract.py",
        '("sm70_w13_n_dim", W13_N),',
        '("sm70_w13_n_dim", INTERMEDIATE),',
        ("tests/dispatch/test_init_contract.py",),
        "W13's N is gate+up interleaved, 320 per rank; 160 would accept half-width banks",
    ),
    Fault(
        "init-group-128",
        "qpnserve/dispatch/contract.py",
        "groups13, groups2 = HIDDEN // GROUP, INTERMEDIATE // GROUP",
        "groups13, groups2 = HIDDEN // (4 * GROUP), INTERMEDIATE // GROUP",
        ("tests/dispatch/test_init_contract.py",),
        "group-128 scale banks would pass the contract of a group-32 operator",
    ),
    Fault(
        "route-flag-true",
        "qpnserve/dispatch/flag.py",
        "    if raw in ROUTE_FLAG_VALUES:",
        '    if raw in (*ROUTE_FLAG_VALUES, "true"):',
        ("tests/dispatch/test_flag_and_plugin.py",),
        "the flag is exactly 0 or 1; a synonym here disagrees with the host's own parser",
    ),
    # -- the CPU reference, the FP64 oracle and verify's independent decoding --
    Fault(
        "oracle-dequant-two-roundings",
        "qpnserve/kernels/reference.py",
        "    return (codes * s + b).astype(np.float16).astype(np.float64)",
        "    return ((codes * s).astype(np.float16).astype(np.float64) + b)"
        ".astype(np.float16).astype(np.float64)",
        ("tests/kernels/test_reference.py",),
        "the contract's dequant is one FP16 fma; a double rounding moves the oracle's bounds",
    ),
    Fault(
        "oracle-invalid-ids-not-zeroed",
        "qpnserve/kernels/reference.py",
        "        if not 0 <= e < experts:",
        "        if not e < experts:",
        ("tests/kernels/test_op_cpu.py",),
        "a negative id would index an expert from the end instead of contributing zero",
        k="invalid",
    ),
    Fault(
        "verify-dequant-q-minus-z",
        "qpnserve/verify/reference.py",
        "        return (q * s_k + b_k).astype(np.float16).astype(np.float64)",
        "        return ((q - np.repeat(z, GROUP, axis=0)) * s_k)"
        ".astype(np.float16).astype(np.float64)",
        ("tests/verify/",),
        "fp16((q-z)*s) is not the operator's fp16(q*s + fp16(-z*s)): verify's bounds drift",
    ),
    Fault(
        "verify-awq-nibble-order",
        "qpnserve/verify/reference.py",
        "AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)",
        "AWQ_ORDER = (0, 1, 2, 3, 4, 5, 6, 7)",
        ("tests/verify/",),
        "a decoder that reads AWQ's packing in plain order checks the wrong weights",
    ),
    Fault(
        "verify-w13-interleave",
        "qpnserve/verify/prepare.py",
        "paired[:, 0::2], paired[:, 1::2] = gate, up",
        "paired[:, 0::2], paired[:, 1::2] = up, gate",
        ("tests/verify/",),
        "gate and up swapped in the prepared W13 bank: silu lands on the wrong half",
    ),
    Fault(
        "verify-host-inputs-up-first",
        "qpnserve/verify/host_prepare.py",
        "np.concatenate([gate.qweight[:, words], up.qweight[:, words]], axis=1)",
        "np.concatenate([up.qweight[:, words], gate.qweight[:, words]], axis=1)",
        ("tests/verify/test_offline_host.py",),
        "the host's converter fed [up | gate] where vLLM's loader leaves [gate | up]: a correct "
        "host preparation would be reported as wrong",
    ),
    Fault(
        "native-capture-served-always-identical",
        "qpnserve/dispatch/capture.py",
        'same = "identical" if bool(torch.equal(out, served)) else "differs"',
        'same = "identical"',
        ("tests/verify/test_live_native.py",),
        "a native host serving admitted calls with something else than its route would be "
        "reported as served by the route",
    ),
    Fault(
        "native-capture-ignores-host-decision",
        "qpnserve/dispatch/wrap.py",
        "if getattr(layer, NATIVE_DECISION_ATTR, False) is True and (",
        "if (",
        ("tests/verify/test_live_native.py",),
        "the native capture would run the host's op on a layer the host declined (its banks "
        "need not be in the op's layout)",
    ),
    Fault(
        "cli-passes-on-capture-dir",
        "qpnserve/cli/app.py",
        "ctx.obj = with_environ(load_settings(), {VERIFY_CAPTURE_DIR.name: None})",
        "ctx.obj = load_settings()",
        (LC + "test_capture_dir_not_passed_on.py",),
        "an exported capture dir would make a production server wrap the host's hook and capture",
    ),
    Fault(
        "verify-op-probe-one-format",
        "qpnserve/verify/sources.py",
        "            _probe_op(op, fmt_banks, dev)",
        "            _probe_op(op, banks[next(iter(banks))], dev)",
        ("tests/verify/test_offline_host.py",),
        "a host op that takes 3-byte metadata only would be run on 4-byte banks (or never used)",
    ),
    # -- the preflight --
    Fault(
        "preflight-num-experts",
        "qpnserve/preflight/checks_config.py",
        '("num_experts", geometry.NUM_EXPERTS),',
        '("num_experts", geometry.NUM_EXPERTS // 2),',
        (PF + "test_checks_checkpoint.py",),
        "a 256-expert export would pass and the operator would index past its banks",
    ),
    Fault(
        "preflight-top-k",
        "qpnserve/preflight/checks_config.py",
        '("num_experts_per_tok", geometry.TOP_K),',
        '("num_experts_per_tok", geometry.TOP_K - 2),',
        (PF + "test_checks_checkpoint.py",),
        "the operator takes exactly 10 routes",
    ),
    Fault(
        "geometry-hidden-2048",
        "qpnserve/geometry.py",
        "HIDDEN = 2560",
        "HIDDEN = 2048",
        (PF + "test_contract_literals.py",),
        "the one geometry table is circular everywhere else; only literals catch it",
    ),
    Fault(
        "geometry-intermediate-768",
        "qpnserve/geometry.py",
        "MOE_INTERMEDIATE = 640",
        "MOE_INTERMEDIATE = 768",
        (PF + "test_contract_literals.py",),
        "160 per rank at TP4 is what the operator is built for",
    ),
    Fault(
        "geometry-layers-47",
        "qpnserve/geometry.py",
        "NUM_MOE_LAYERS = 48",
        "NUM_MOE_LAYERS = 47",
        (PF + "test_contract_literals.py",),
        "the fixture and the layer filters would describe another model",
    ),
    Fault(
        "geometry-group-128",
        "qpnserve/geometry.py",
        "GROUP = 32",
        "GROUP = 128",
        (PF + "test_contract_literals.py",),
        "the operator is group-32; a group-128 export would be called native",
    ),
    Fault(
        "tp8-asks-for-8-v100s",
        "qpnserve/preflight/checks_gpu.py",
        "        if tp != TP_SIZE:",
        "        if tp < TP_SIZE:",
        (PF + "test_checks_machine.py",),
        "--tp 8 must say use --tp 4, not 'run on a host with 8 V100s' (#32 defect 3)",
    ),
    Fault(
        "facts-file-empty-accepted",
        "qpnserve/preflight/gather.py",
        "        if getattr(facts, key) is None",
        "        if not hasattr(facts, key)",
        (PF + "test_facts_file.py",),
        "a facts file of {} would SKIP every machine check and report ready (#32 defect 9)",
    ),
    Fault(
        "stand-in-note-silent",
        "qpnserve/preflight/report.py",
        '    if facts.source != "recorded":',
        "    if facts.source == facts.source:",
        (LC + "test_facts_stand_in.py",),
        "status would present hand-written facts as this host's (#32 defect 7)",
    ),
    # -- bench --
    Fault(
        "bench-window-interval",
        "qpnserve/bench/summarize.py",
        "    end_s = min(r.chunk_times_s[-1] for r in wave)",
        "    end_s = max(r.chunk_times_s[-1] for r in wave)",
        ("tests/bench/test_summarize.py",),
        "the pure decode window must be the interval where every request decodes",
    ),
    Fault(
        "steps-share-bucket",
        "qpnserve/bench/steps.py",
        "return le is not None and float(le) == 1.0",
        "return le is not None and float(le) == 2.0",
        ("tests/bench/test_steps.py",),
        'the single-token share is the le="1" bucket; le="2" counts 2-token steps too',
    ),
    Fault(
        "speculation-equals-form",
        "qpnserve/speculation.py",
        '    name, eq, value = body.partition("=")',
        '    name, eq, value = body, "", ""',
        ("tests/test_speculation.py",),
        "--speculative-config={...} would be read as no speculation",
    ),
    # -- state, secrets, processes, exit codes --
    Fault(
        "api-key-in-desired",
        "qpnserve/lifecycle/options.py",
        '        extra_args, key = split_api_key(data["extra_args"])',
        '        _, key = split_api_key(data["extra_args"])',  # the key stays in extra_args
        (LC + "test_api_key.py",),
        "the API key would stay in the server argv and desired.json",
    ),
    Fault(
        "redact-url-credentials",
        "qpnserve/report/redact.py",
        "    text = _URL_CREDENTIALS.sub(lambda m: f\"{m.group('scheme')}{REDACTED}@\", text)",
        "    text = text",
        ("tests/report/test_redact.py",),
        "a report would carry https://user:token@host from a pip index URL",
    ),
    Fault(
        "state-write-not-atomic",
        "qpnserve/state.py",
        '        atomic_write_text(path, data.model_dump_json(indent=2) + "\\n")',
        '        path.write_text(data.model_dump_json(indent=2) + "\\n")',
        (LC + "test_state_files.py",),
        "a crash mid-write leaves half a state file (and a world-readable one)",
    ),
    Fault(
        "down-signals-leader-only",
        "qpnserve/lifecycle/procs.py",
        "        os.killpg(pgid, sig)",
        "        os.kill(pgid, sig)",
        (LC + "test_signals.py",),
        "vLLM's workers would outlive `down` and keep the GPUs",
    ),
    Fault(
        "exit-code-table",
        "qpnserve/errors.py",
        "    CANARY = 7",
        "    CANARY = 8",
        ("tests/test_cli_frame.py",),
        "scripts branch on the documented exit codes",
    ),
    # -- one per weakened test of issue 32 --
    Fault(
        "wt-malformed-config-coverage",
        "qpnserve/preflight/checks_tensors.py",
        'return _r(name, "SKIP", "no MoE layers in config.json")',
        'return _r(name, "PASS", "no MoE layers in config.json")',
        (PF + "test_checks_checkpoint.py",),
        "coverage that examined no layer must never pass (test_checks_checkpoint:200 was weak)",
        k="malformed",
    ),
    Fault(
        "wt-unreadable-directory",
        "qpnserve/preflight/checkpoint.py",
        "    except OSError as exc:\n"
        "        return CheckpointFacts(\n"
        "            path=where, exists=True, is_dir=True, "
        'error=f"cannot list it: {exc.strerror or exc}"\n'
        "        )\n",
        "    except OSError:\n        entries = []\n",
        (PF + "test_checks_checkpoint.py",),
        "the root-only branch (never ran in CI): an unlistable directory must FAIL",
        k="unreadable_model_directory",
    ),
    Fault(
        "wt-refusal-line",
        "qpnserve/lifecycle/up.py",
        '    return f"{first.process} (pid {first.pid}): {first.reason}"',
        '    return f"{first.process}: {first.reason}"',
        (LC + "test_refusal_line.py",),
        "the e2e failures test built its expected line from the actual one; this is the "
        "non-e2e equivalent: the refusal line names the refusing process and its pid",
    ),
    Fault(
        "wt-build-stage-arch",
        "qpnserve/lifecycle/stages.py",
        "    result = build(arch_list=arch, progress=progress, build_dir=settings.build_dir)",
        '    result = build(arch_list="7.0", progress=progress, build_dir=settings.build_dir)',
        (LC + "test_build_stage.py",),
        "test_build_stage asserted its own fake's key; $QPNSERVE_BUILD_ARCH must reach build",
    ),
    Fault(
        "wt-dry-run-more-count",
        "qpnserve/lifecycle/stages.py",
        'more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""',
        'more = " (and 1 more)" if len(failed) > 1 else ""',
        (LC + "test_dry_run.py",),
        "test_dry_run's or-chain accepted any '(and N more)'",
        k="failing_preflight",
    ),
    Fault(
        "wt-teardown-silent-kill",
        "tests/lifecycle/conftest.py",
        "    pytest.fail(\n",
        "    return\n    pytest.fail(\n",
        (LC + "test_teardown.py",),
        "the teardown killed leaked processes in silence, so a leaking test passed",
        k="leaks",
    ),
    Fault(
        "wt-export-qzeros-shape",
        "qpnserve/preflight/layout.py",
        'specs[f"{proj}.qzeros"] = TensorSpec("I32", (k // group_size, n // pack))',
        'specs[f"{proj}.qzeros"] = TensorSpec("I32", (k // group_size, n))',
        (PF + "test_contract_literals.py",),
        "the fixture used the checker's own specs: a wrong shape passed everywhere",
    ),
    Fault(
        "wt-banks-broken-import",
        "qpnserve/kernels/reference.py",
        "import numpy as np\n",
        "import numpy as np\nimport qpnserve.no_such_module  # noqa: F401\n",
        ("tests/bench_op/test_banks.py",),
        "test_banks importorskip'ed the product: a broken module skipped 9 tests (the "
        "bench_op conftest now imports it too, so the whole folder fails)",
    ),
    Fault(
        "wt-gpu-invalid-ids",
        "csrc/awq_moe_m1_v100.cuh",
        "const bool valid = route_is_valid(e, a.num_experts);",
        "const bool valid = e < a.num_experts;",
        ("tests/kernels/test_op_gpu.py",),
        "the V100 design's GPU tests against the FP64 oracle: a negative id reads out of bounds",
        k="invalid or oracle",
        needs_gpu=True,
    ),
)
