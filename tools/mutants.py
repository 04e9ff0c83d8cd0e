"""The planted bugs of ``tools/mutate.py``: each replaces one exact text (found once) of one file, and names the
tests that must catch it. Keep ``old`` short and exact; when the code moves, the run says which one no longer
applies."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    why: str  # what the planted bug does
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


CHECK = ("tests/transforms/test_check.py", "tests/transforms/test_worker.py")
W = "transforms/worker.py"

SHARDS = ("tests/service/test_bench_shards.py",)
BT = "service/bench_transfer.py"
DEVICES = ("tests/tunebank/test_cli_bench_devices.py",)

MUTANTS: list[Mutant] = [
    # the correctness check
    Mutant("check-absolute-floor", "floor max(1e-3 * largest, 1.0): small outputs judged absolutely", W,
           "floor = max(FLOOR_FRACTION * _largest(magnitude), normal)",
           "floor = max(FLOOR_FRACTION * _largest(magnitude), 1.0)", CHECK),
    Mutant("check-no-scale-floor", "floor only the dtype's smallest normal: near-zero elements fail", W,
           "floor = max(FLOOR_FRACTION * _largest(magnitude), normal)", "floor = normal", CHECK),
    Mutant("check-no-dtype-floor", "floor ignores the output dtype (fp16 subnormals)", W,
           "normal = float(np.finfo(_NORMAL.get(dtype or \"\", reference.dtype)).tiny)",
           "normal = float(np.finfo(reference.dtype).tiny)", CHECK),
    Mutant("check-floor-fraction", "floor 1e-2 of the largest instead of 1e-3", W,
           "FLOOR_FRACTION = 1e-3", "FLOOR_FRACTION = 1e-2", CHECK),
    Mutant("check-absolute-error", "absolute error, not relative", W,
           "gap = xp.abs(output - reference) / xp.maximum(magnitude, reference.dtype.type(floor))",
           "gap = xp.abs(output - reference)", CHECK),
    Mutant("check-mean-error", "mean error instead of the worst element", W,
           "worst = _largest(xp.where(finite, gap, 0))", "worst = float(xp.where(finite, gap, 0).mean())", CHECK),
    Mutant("check-tolerance-inclusive-wrong", "passes up to twice the tolerance", W,
           "or worst > tolerance:", "or worst > 2 * tolerance:", CHECK),
    Mutant("check-nan-passes", "a NaN output where the reference is finite passes", W,
           "nonfinite_mismatch = ~finite & (output != reference)  # NaN != NaN",
           "nonfinite_mismatch = ~finite & (output != reference) & ~xp.isnan(output)", CHECK),
    Mutant("check-nan-equals-nan", "NaN matches a NaN reference", W,
           "nonfinite_mismatch = ~finite & (output != reference)  # NaN != NaN",
           "nonfinite_mismatch = ~finite & (output != reference) & ~(xp.isnan(output) & xp.isnan(reference))",
           CHECK),
    Mutant("check-nonfinite-ignored", "non-finite mismatches are not failures", W,
           "if bool(nonfinite_mismatch.any()) or worst > tolerance:", "if worst > tolerance:", CHECK),
    Mutant("check-nan-tolerance", "a NaN tolerance passes everything", W,
           "if not tolerance >= 0:", "if tolerance < 0:", CHECK),
    Mutant("check-shape", "shapes not compared (broadcast)", W,
           "if output.shape != reference.shape:", "if output.size != reference.size:", CHECK),
    Mutant("check-first-output-only", "only the first output buffer is checked", W,
           "for b in written:", "for b in written[:1]:", CHECK),
    Mutant("check-last-output-only", "only the last output buffer is checked", W,
           "for b in written:", "for b in written[-1:]:", CHECK),
    Mutant("check-unheld-output", "an output no launch holds is not checked", W,
           "if unwritten:", "if False:", CHECK),
]

INDEX = ("tests/db/test_vector_index.py",)
JOBS = ("tests/db/test_jobs.py", "tests/db/test_concurrency.py")
VI = "db/index/vector_index.py"
J = "db/repositories/jobs.py"

MUTANTS += [
    # the index watermark
    Mutant("index-metric-ignored", "a file of another metric is loaded", VI,
           "if (mark.factory, mark.metric) != (self.config.factory, str(self.config.metric)):",
           "if mark.factory != self.config.factory:", INDEX),
    Mutant("index-factory-ignored", "a file of another factory is loaded", VI,
           "if (mark.factory, mark.metric) != (self.config.factory, str(self.config.metric)):",
           "if mark.metric != str(self.config.metric):", INDEX),
    Mutant("index-no-persist-after-catch-up", "the catch-up on open is not saved", VI,
           "        elif index._add(index._fetch(index._last_id)):\n            index._persist()",
           "        else:\n            index._add(index._fetch(index._last_id))", INDEX),
    Mutant("index-sha-ignored", "a corrupt file is loaded", VI,
           "if sha256(data) != mark.sha256:", "if False:", INDEX),
    Mutant("index-count-through-ignored", "deleted rows do not make the file stale", VI,
           "if count_through(session, self.key, mark.last_id) != mark.count:", "if False:", INDEX),
    Mutant("index-sync-no-persist", "sync adds but never saves", VI,
           "            if added and persist:\n", "            if added and not persist:\n", INDEX),
    # job claiming
    Mutant("jobs-claim-unguarded", "the claim's UPDATE does not re-check the row", J,
           "update(Job).where(Job.id == row.id, Job.attempts == row.attempts, _claimable(now))",
           "update(Job).where(Job.id == row.id)", JOBS),
    Mutant("jobs-claim-no-attempts-guard", "the claim's UPDATE ignores a claim in between", J,
           "update(Job).where(Job.id == row.id, Job.attempts == row.attempts, _claimable(now))",
           "update(Job).where(Job.id == row.id, _claimable(now))", JOBS),
    Mutant("jobs-claim-no-claimable-guard", "the claim's UPDATE ignores a held lease", J,
           "update(Job).where(Job.id == row.id, Job.attempts == row.attempts, _claimable(now))",
           "update(Job).where(Job.id == row.id, Job.attempts == row.attempts)", JOBS),
    Mutant("jobs-lease-never-expires", "a dead worker's job is never claimed again", J,
           "expired = (Job.status == JobStatus.RUNNING) & (Job.lease_expires_at < now)",
           "expired = (Job.status == JobStatus.RUNNING) & (Job.lease_expires_at < now) & False", JOBS),
    Mutant("jobs-attempts-uncapped", "max_attempts ignored", J,
           "        if row.attempts >= max_attempts:", "        if row.attempts > max_attempts:", JOBS),
    Mutant("jobs-heartbeat-any-owner", "a worker that lost its lease extends it", J,
           "update(Job).where(Job.id == job_id, Job.lease_owner == owner, Job.status == JobStatus.RUNNING)",
           "update(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING)", JOBS),
    Mutant("jobs-newest-first", "the newest job is claimed first", J,
           ".where(_claimable(now)).order_by(Job.id).limit(1)",
           ".where(_claimable(now)).order_by(Job.id.desc()).limit(1)", JOBS),
]

TRANSFER = ("tests/service/test_transfer.py",)
T = "service/transfer.py"

MUTANTS += [
    # transfer tuning
    Mutant("transfer-k-minus-2-neighbours", "the neighbours are cut to k - 2", T,
           "if row.structural_hash not in exclude][:k]", "if row.structural_hash not in exclude][:max(k - 2, 1)]",
           TRANSFER),
    Mutant("transfer-asks-k-minus-2", "transfer_tune asks for k - 2 neighbours", T,
           "near = neighbours(session, index, vector, task=task, device_id=device_id, k=k,",
           "near = neighbours(session, index, vector, task=task, device_id=device_id, k=max(k - 2, 1),", TRANSFER),
    Mutant("transfer-exclusions-take-places", "excluded subgraphs count against k", T,
           "found = index.search(session, vector, k + len(exclude), kinds={task.kind})",
           "found = index.search(session, vector, k, kinds={task.kind})", TRANSFER),
    Mutant("transfer-first-neighbour-only", "only the first neighbour's recipe is tried", T,
           "given = [r for r in dict.fromkeys(parse(n.recipe) for n in near) if r != default and",
           "given = [r for r in dict.fromkeys(parse(n.recipe) for n in near[:1]) if r != default and", TRANSFER),
    Mutant("transfer-no-library", "the vendor library's recipes are only a fill candidate", T,
           "libraries = [r for r in space.alternatives if r != default] if library else []",
           "libraries = []", TRANSFER),
    Mutant("transfer-third-fastest-recipe", "a neighbour gives its third fastest recipe", T,
           "ranked = {row.id: [best[row.id]] if row.id in best else [] for row, _ in hits}",
           "ranked = {row.id: top_k_recipes(session, subgraph_id=row.id, device_id=device_id, k=3)[-1:]\n"
           "                  for row, _ in hits}", TRANSFER),
    Mutant("transfer-winner-is-default", "the default always wins", T,
           "winner: tuple[Recipe, RunResult] = searcher.best or (default, base)",
           "winner: tuple[Recipe, RunResult] = (default, base)", TRANSFER),
]

PROBLEM = ("tests/transforms/test_problem.py", "tests/transforms/test_run.py", "tests/transforms/test_worker.py",
           "tests/transforms/test_vendor.py")
MUTANTS += [
    # what validation holds a kernel to, and what a plan hands it
    Mutant("scratch-zeroed", "validation hands kernels zeroed scratch, which a plan does not", W,
           "        else:\n            arrays[b.name] = poisoned(b.shape, b.dtype)",
           "        elif b.kind == \"output\":\n            arrays[b.name] = poisoned(b.shape, b.dtype)\n"
           "        else:\n            arrays[b.name] = to_storage(np.zeros(b.shape), b.dtype)", PROBLEM),
    Mutant("tolerance-no-plain-float32", "the tolerance ignores what a plain float32 evaluation errs",
           "transforms/problem.py", "tolerance = _raised(program, sig.names, plain, reference, tolerance, xp)",
           "tolerance = dict(tolerance)", PROBLEM),
    Mutant("tolerance-tf32-as-float32", "a TF32 trial is held to float32's tolerance", "transforms/run.py",
           "        tf32 = computes_in_tf32(launches)\n", "        tf32 = False\n", PROBLEM),
    Mutant("tolerance-not-merged", "a described problem keeps its first tolerances when its arrays are built",
           "transforms/run.py",
           "self.tolerance, self.tf32 = _merged(self.tolerance, built.tolerance), _merged(self.tf32, built.tf32)",
           "pass", PROBLEM),
    Mutant("tf32-offered-regardless", "TF32 convolutions offered where PyTorch's TF32 is off",
           "transforms/steps/conv.py", "if tf32 or TF32 not in args]", "]", PROBLEM),
    Mutant("eager-scalars-on-device", "relu6's constants stay one-element device tensors", "embed/eager.py",
           "            .to(\"cpu\" if name in scalar else device, TORCH_DTYPES[t.dtype])",
           "            .to(device, TORCH_DTYPES[t.dtype])", ("tests/embed/test_eager.py",)),
]

EVALUATE = ("tests/embed/test_evaluate.py", "tests/transforms/test_problem.py")
E = "embed/evaluate.py"
ADAPT = ("tests/transforms/test_space.py", "tests/transforms/test_split.py", "tests/service/test_transfer.py")
A, TR = "transforms/adapt.py", "transforms/transformation.py"
INGEST = ("tests/db/test_measurements.py", "tests/db/test_concurrency.py")
M, INS = "db/repositories/measurements.py", "db/repositories/_insert.py"
CUDA_ROWS = ("tests/transforms/test_cuda_merges.py", "tests/transforms/test_cuda_on_host.py",
             "tests/transforms/test_codegen_cuda.py", "tests/transforms/test_split.py")
CU, ROWS = "transforms/codegen/cuda.py", "transforms/codegen/cuda_rows.py"

MUTANTS += [
    # the reference evaluator
    Mutant("evaluate-absent-ignored", "a sum over a dim neither operand has is not scaled", E,
           "            product = product * absent", "            product = product", EVALUATE),
    Mutant("evaluate-absent-either", "dims one operand lacks count as absent", E,
           "absent = math.prod(self.shape[k] for k in red if k not in has_a | has_b)",
           "absent = math.prod(self.shape[k] for k in red if k not in has_a & has_b)", EVALUATE),
    Mutant("evaluate-own-axes-not-summed", "a reduction dim only one operand has is not summed first", E,
           "a = a.sum(axis=own_a, keepdims=True) if own_a else a", "a = a", EVALUATE),
    Mutant("evaluate-gelu-tanh", "the tanh GELU's cubic coefficient is off", E,
           "0.044715 * x * x * x", "0.04715 * x * x * x", EVALUATE),
    Mutant("evaluate-rsqrt", "rsqrt is sqrt", E, '"rsqrt": lambda x: 1.0 / xp.sqrt(x),', '"rsqrt": xp.sqrt,',
           EVALUATE),
    Mutant("evaluate-ragged-mask", "a ragged row's padding is summed", E,
           "            value = xp.where(self.mask, value, combiner.identity)\n", "", EVALUATE),
    Mutant("evaluate-padding-fill", "padded reads return clamped values, not the fill", E,
           "return values if fill is None else xp.where(inside, values, fill)", "return values", EVALUATE),
    Mutant("evaluate-empty-reduction", "an empty reduction gives 0, not its identity", E,
           "return xp.full([1 if k in red else n for k, n in enumerate(value.shape)], combiner.identity)",
           "return xp.full([1 if k in red else n for k, n in enumerate(value.shape)], 0.0)", EVALUATE),
    Mutant("evaluate-cast-floor", "a float cast to int floors instead of truncating", E,
           "return (xp.trunc(value) if value.dtype.kind", "return (xp.floor(value) if value.dtype.kind", EVALUATE),
    Mutant("evaluate-out-of-range-silent", "an out-of-range index is clamped silently", E,
           "            if bad.any():\n                raise EvaluationError",
           "            if False:\n                raise EvaluationError", EVALUATE),
    # adapt
    Mutant("adapt-tiles-collapse", "tiles of different dims override each other", A,
           'key = (legal.name, legal.args[0] if legal.name == "tile" else None)', "key = (legal.name, None)", ADAPT),
    Mutant("adapt-changes-unsaid", "a changed step is not reported", A,
           "        if legal != step:\n", "        if False:\n", ADAPT),
    Mutant("adapt-keeps-illegal", "steps are kept as they are", A,
           "legal = transformation.nearest(step, program, backend)", "legal = step", ADAPT),
    Mutant("adapt-first-wins", "an earlier step for a choice wins over a later one", A,
           '            changes.append(f"{kept.pop(key)}: replaced by the later {legal}")', "            continue",
           ADAPT),
    Mutant("adapt-any-role", "tile(p1, ..) may become a tile of another dim", TR,
           "groups = [g for g in groups if g[0].args[:1] == step.args[:1]]", "groups = groups", ADAPT),
    Mutant("adapt-linear-distance", "nearest by linear, not log2, distance", TR,
           "total += abs(math.log2(max(x, 1)) - math.log2(max(y, 1)))", "total += abs(x - y)", ADAPT),
    # ingest
    Mutant("ingest-ok-with-error", "an ok measurement may carry an error kind", M,
           "if self.ok and (self.error_kind is not None or self.median_s is None):",
           "if self.ok and self.median_s is None:", INGEST),
    Mutant("ingest-infinite-time", "an infinite median is accepted", M,
           "if value is not None and not (math.isfinite(value) and value >= 0):",
           "if value is not None and not value >= 0:", INGEST),
    Mutant("ingest-pages-drop-last", "each page drops its last row", INS,
           "yield items[start : start + size]", "yield items[start : start + size - 1]", INGEST),
    Mutant("ingest-sqlite-count", "sqlite counts every row as inserted", INS,
           "len(session.execute(statement, [dict(zip(columns, row, strict=True)) for row in page]).all())",
           "session.execute(statement, [dict(zip(columns, row, strict=True)) for row in page]) and len(page)",
           INGEST),
    Mutant("ingest-postgres-count", "PostgreSQL counts every row as inserted", INS,
           "        return cursor.rowcount\n", "        return len(rows)\n", INGEST),
    Mutant("ingest-unknown-fields", "unknown fields are ignored", M,
           "    if unknown:\n        raise InvalidRecordError", "    if False:\n        raise InvalidRecordError",
           INGEST),
    Mutant("ingest-embeddings-after-spins", "embeddings_after re-reads its last row forever",
           "db/repositories/embeddings.py",
           "        after_id = rows[-1].id\n", "        after_id = rows[-1].id - 1\n", INDEX),
    # cuda row math: checked on the host (merge helpers compiled alone, thread-per-row kernels emulated)
    Mutant("cuda-welford-merge", "Chan's merge drops the n factor of M2", CU,
           "m += d * f; q += q2 + d * d * n * f; n = all;", "m += d * f; q += q2 + d * d * f; n = all;", CUDA_ROWS),
    Mutant("cuda-welford-mean", "Chan's merge moves the mean by the wrong weight", CU,
           "const T all = n + n2, d = m2 - m, f = n2 / all;", "const T all = n + n2, d = m2 - m, f = n / all;",
           CUDA_ROWS),
    Mutant("cuda-online-rescale", "the online softmax does not rescale the running sum", CU,
           "s = (m == mn ? s : s * EXP(m - mn))", "s = (m == mn ? s : s)", CUDA_ROWS),
    Mutant("cuda-rows-chunk-mean", "a chunk's mean divides by one element too many", ROWS,
           "* {literal(1 / width, t)}; const {t} {cq} = {squares}; ",
           "* {literal(1 / (width + 1), t)}; const {t} {cq} = {squares}; ", CUDA_ROWS),
    Mutant("cuda-rows-chunk-max", "a chunk's max skips its last value", ROWS,
           "            for x in xs[1:]:\n                chunk_max",
           "            for x in xs[1:-1]:\n                chunk_max", CUDA_ROWS),
    # a transfer benchmark measured in shards, stage by stage (bench transfer --devices)
    Mutant("shard-takes-everything", "every shard measures every subgraph of its stage", BT,
           "        return [item for i, item in enumerate(items) if i in mine]", "        return list(items)", SHARDS),
    Mutant("shard-cross-early", "the cross table is measured with each subgraph's own search, before every best "
           "is known", BT, "            self._tune(key)\n            if key in held:",
           "            self._tune(key)\n            self._cross(key)\n            if key in held:", SHARDS),
    Mutant("shard-skips-earlier-stages", "a later stage's shard does not replay (or measure) the earlier stages", BT,
           "        for n, key in enumerate(keys, 1):\n            self.progress(f\"subgraphs",
           "        for n, key in enumerate(keys if last == 0 or shard is None else [], 1):\n"
           "            self.progress(f\"subgraphs", SHARDS),
    Mutant("devices-no-merge", "the shards' tables are not merged: the command's own run measures it all again",
           "tunebank/cli/bench_devices.py",
           "                table.merge(MeasurementTable.from_json(done[\"measurements\"]))", "                pass",
           DEVICES),
    Mutant("bench-library-not-given", "--library does not reach the transfers", BT,
           "fill=fill != \"none\", rank=rank, pool=pool, library=c.library)",
           "fill=fill != \"none\", rank=rank, pool=pool)", SHARDS),
    Mutant("bench-library-random-evaluations", "the random row does not count its library candidates",
           "service/bench_report.py", "                         [k + 1 + o.library for o in outcomes]))",
           "                         [k + 1 for o in outcomes]))", SHARDS),
    Mutant("bench-library-paired-evaluations", "the paired difference with random does not count them",
           "service/bench_report.py", "float(np.mean([k + 1 + o.library for o in outcomes]))",
           "float(k + 1)", SHARDS),
    Mutant("provisional-miscount", "the provisional replay misses the first failed kernel of each batch",
           "service/measure.py", "self.made_up += [(self._key, str(r)) for r in recipes]",
           "self.made_up += [(self._key, str(r)) for r in recipes[1:]]", SHARDS),
    Mutant("provisional-keeps-made-up", "forget() leaves the made-up failures in the table", "service/measure.py",
           "            self.table.results[key].pop(recipe, None)", "            pass", SHARDS),
    Mutant("provisional-keeps-eager", "forget() leaves the unknown eager times in the table", "service/measure.py",
           "            self.table.eager.pop(key, None)", "            pass", SHARDS),
    Mutant("provisional-writes-json", "the provisional report's made-up failures are written as a recording",
           "tunebank/cli/bench.py", "    if not provisional:\n", "    if True:\n", DEVICES),
    # what is kept with a program
    Mutant("memo-choices-any-backend", "a program's choices are kept for whichever backend asked first",
           "transforms/transformation.py", 'program.memoized(("choices", self.name, backend),',
           'program.memoized(("choices", self.name),', ("tests/transforms/test_space.py",)),
    Mutant("memo-groups-any-mode", "a program's fuse groups are kept for whichever mode asked first",
           "transforms/schedule.py", 'program.memoized(("plan_groups", mode),', 'program.memoized(("plan_groups",),',
           ("tests/transforms/test_schedule.py",)),
    # integer outputs, the strong database (the worker's restart is guarded by a GPU test: tests/transforms/test_run.py)
    Mutant("check-integer-reference", "an integer reference goes to finfo", W,
           "    if reference.dtype.kind != \"f\":", "    if False:", CHECK),
    Mutant("codegen-integers-in-float32", "integer outputs computed in float32", "transforms/codegen/kernel.py",
           "(b.kind == BufferKind.OUTPUT and b.dtype in (DType.INT64, DType.INT32))", "False",
           ("tests/transforms/test_codegen_c.py",)),
    Mutant("measure-forgets-messages", "a failed candidate's message is lost: the report says only its kind",
           "service/measure.py", "                    self.messages[key, text] = result.error",
           "                    pass", ("tests/service/test_optimize.py",)),
    Mutant("bench-strong-database-ignored", "--database strong stores what a crawl stores", BT,
           "                if self.config.database == \"strong\":", "                if False:",
           ("tests/service/test_bench_transfer.py",)),
]

ATT = ("tests/transforms/test_attention.py",)
FUSE = ("tests/service/test_fused_attention.py",)
MUTANTS += [
    # fused attention, overlapped waits, raised tolerances on demand (thirteenth session)
    Mutant("attention-div-as-mul", "a softmax's division by c taken as a scale of c", "transforms/attention.py",
           "scale * other.value[0] if node.op == \"mul\" else scale / other.value[0]",
           "scale * other.value[0]", ATT),
    Mutant("attention-mask-before-scale", "a mask added before the scaling is fused (it would be scaled too)",
           "transforms/attention.py", "and mask is None and (node.op == \"mul\"", "and (node.op == \"mul\"", ATT),
    Mutant("attention-scores-shared", "scores another subgraph reads are fused away", "transforms/attention.py",
           "readers.get(scores) != {r} or ", "", ATT),
    Mutant("attention-mask-dropped", "the fused call ignores the mask", "transforms/attention.py",
           "attn_mask=mask, scale", "attn_mask=None, scale", ATT),
    Mutant("attention-unvalidated", "a fused call that errs is kept", "transforms/attention.py",
           "if not error <= tolerance:", "if False:", ATT),
    Mutant("attention-verify-lax", "verify takes any attention step", "transforms/plan.py",
           "if found is None or tuple(step.folded) != found.folded or set(found.folded) & set(folds):",
           "if found is None:", ATT),
    Mutant("fuse-without-margin", "the fused attention kept when slower", "service/fused_attention.py",
           "trial.seconds * (1 + margin) < total", "trial.seconds * (1 + margin) > total", FUSE),
    Mutant("fuse-untimed-steps", "an attention with an untimed step is fused", "service/fused_attention.py",
           "        if any(s is None for s in apart):\n            continue", "", FUSE),
    Mutant("build-each-waits-for-all", "build_each yields only once every source compiled", "transforms/build.py",
           "        for future in [pool.submit(one, source) for source in sources]:\n            yield future.result()",
           "        done = [f.result() for f in [pool.submit(one, source) for source in sources]]\n"
           "        yield from done", ("tests/transforms/test_build.py",)),
    Mutant("tune-cpu-streams", "cpu candidates are timed while others compile", "transforms/tune.py",
           "built = builds if backend == \"cuda\" else iter(list(builds))", "built = builds",
           ("tests/transforms/test_tune.py",)),
    Mutant("warm-worker-waited-for", "a warmed, unused worker is waited for at close", "transforms/run.py",
           "            if not self._ready:  # warmed and never used: nothing to finish\n"
           "                self._proc.kill()\n            elif", "            if", ("tests/transforms/test_run.py",)),
    Mutant("raised-tolerance-never", "a candidate failing the dtype's tolerance is never held to the raised one", W,
           "if kind == \"wrong\" and error is not None and problem.raise_tolerances():",
           "if False:", ("tests/transforms/test_worker.py",)),
    Mutant("raised-tolerance-always", "the raised tolerances are computed for every problem at load",
           "transforms/worker.py", "return cls(source, built.inputs, built.reference, built.tolerance, built.tf32, "
           "raise_tolerances)", "return cls(source, built.inputs, built.reference, *raise_tolerances())",
           ("tests/transforms/test_problem.py",)),
    Mutant("prepared-never-built", "the worker builds prepared problems only when a trial asks", W,
           "message = lines.next(0 if problems.pending() or warming else None)", "message = lines.next(None)",
           ("tests/transforms/test_worker.py", "tests/transforms/test_run.py")),
    Mutant("settle-keeps-built", "problems built ahead survive a prepare that no longer names them", W,
           "self.built = {k: p for k, p in self.built.items() if k in self.coming}", "self.built = dict(self.built)",
           ("tests/transforms/test_run.py",)),
    Mutant("ahead-unbounded", "the worker holds every prepared problem at once", W,
           "return len(self.built) < AHEAD and any(", "return any(", ("tests/transforms/test_worker.py",)),
    Mutant("warm-repeated", "a library is warmed again at each prepare", W,
           "if name in WARM and name not in warmed]", "if name in WARM]", ("tests/transforms/test_worker.py",)),
    Mutant("eager-after-prepare", "eager is timed while the worker builds problems on the GPU", "service/optimize.py",
           "_under_bound(tasks[h], row, measurer.eager(tasks[h], h), ctx.device)",
           "_under_bound(tasks[h], row, math.nan, ctx.device)", ("tests/service/test_optimize.py",)),
    Mutant("worker-not-settled", "the parent times on the GPU while the worker may still build",
           "service/optimize.py", "report.built_ahead = worker.settle()", "report.built_ahead = 0",
           ("tests/service/test_optimize.py",)),
    Mutant("close-kills", "a closed worker between trials is killed, not let exit", "transforms/run.py",
           "    try:\n        process.wait(timeout=CLOSE_TIMEOUT_S)", "    try:\n        process.kill()\n"
           "        process.wait(timeout=CLOSE_TIMEOUT_S)", ("tests/transforms/test_run.py",)),
    Mutant("bound-ignored", "a subgraph under its roofline bound is measured anyway", "service/optimize.py",
           "            del tasks[h]\n", "            pass\n", ("tests/service/test_optimize.py",)),
    Mutant("bound-at-full", "eager within its roofline bound (not under half) is left unmeasured",
           "service/optimize.py", "BOUND_FRACTION = 0.5", "BOUND_FRACTION = 1.0", ("tests/service/test_optimize.py",)),
    Mutant("by-ms-inverted", "the report's by-ms ratio is tunebank over the column", "bench/optimize_e2e.py",
           "ratios = [es[c][\"ms\"] / es[\"tunebank\"][\"ms\"]", "ratios = [es[\"tunebank\"][\"ms\"] / es[c][\"ms\"]",
           ("tests/bench/test_optimize_e2e.py",)),
    Mutant("merge-first-wins", "merge keeps the entry started first", "bench/optimize_e2e.py",
           "entry.get(\"started\", \"\") > held.get(\"started\", \"\")",
           "entry.get(\"started\", \"\") < held.get(\"started\", \"\")", ("tests/bench/test_optimize_e2e.py",)),
    Mutant("incumbent-from-nothing", "each batch's candidates are held against nothing known before",
           "service/measure.py", "timeout_s=timeout_s, best_s=table.fastest(task.key))(recipes)",
           "timeout_s=timeout_s)(recipes)", ("tests/service/test_measure_live.py",)),
    Mutant("fastest-without-eager", "eager's time is not an incumbent", "service/measure.py",
           "*([eager] if eager is not None else [])])", "])", ("tests/service/test_measure_live.py",)),
    Mutant("nan-counted-from-reference", "a non-finite reference, not output, makes an output 'nan'", W,
           "bad_output = nonfinite_mismatch & ~np.isfinite(output)",
           "bad_output = nonfinite_mismatch & ~np.isfinite(reference)", ("tests/transforms/test_check.py",)),
]
