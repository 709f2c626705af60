"""Realistic bugs for tools/mutation.py: one exact edit each, and the tests that should fail.

Keep snippets short but unique in their file; when the code changes, the tool reports a
mutant as stale instead of scoring it. `tests` are pytest arguments: files, node ids, or
`-k` expressions; pick the fastest tests that should catch the bug (unit tests with fakes
before end-to-end runs).

Mutants judged equivalent or unobservable are not listed; a comment says which and why.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]


ACTOR_TESTS = ("tests/test_actor.py",)
PIPELINE_TESTS = ("tests/test_pipeline.py",)
CONTROL_TESTS = ("tests/test_control.py",)
THREADS_TESTS = ("tests/runtime/test_threads.py",)
LEARNER_FAKES = ("tests/test_learner.py", "-k", "learner_ and not advances_its_keys")
LOCAL_CONFORMANCE = ("tests/sync/test_conformance.py", "-k", "local")
SHM_CONFORMANCE = ("tests/sync/test_conformance.py", "-k", "shm")
SHM_LAYOUT = ("tests/sync/test_shm.py", "-k", "seqlock and not stress")
EVALUATE_TESTS = ("tests/test_evaluate.py",)
FUSED_TESTS = ("tests/test_fused_rollout.py",)

MUTANTS: list[Mutant] = [
    # --- actor.py --------------------------------------------------------------------------
    Mutant(
        "actor_valid_on_autoreset_steps",
        "podrace/actor.py",
        "np.logical_not(prev_done, out=valid[t])",
        "valid[t] = True",
        ACTOR_TESTS,
    ),
    Mutant(
        "actor_truncation_not_an_episode_end",
        "podrace/actor.py",
        "prev_done = step.terminated | step.truncated",
        "prev_done = step.terminated",
        ACTOR_TESTS,
    ),
    Mutant(
        "actor_lag_bound_off_by_one",
        "podrace/actor.py",
        "needed = seq - self.settings.max_policy_lag",
        "needed = seq - self.settings.max_policy_lag - 1",
        ACTOR_TESTS,
    ),
    Mutant(
        "actor_ignores_newer_params",
        "podrace/actor.py",
        "            if newer is not None:\n                self.snapshot = newer",
        "            if newer is not None:\n                pass",
        ACTOR_TESTS,
    ),
    Mutant(
        "actor_first_seq_ignored",
        "podrace/actor.py",
        "for seq in range(s.first_seq, s.first_seq + s.num_rollouts):",
        "for seq in range(s.num_rollouts):",
        ACTOR_TESTS,
    ),
    Mutant(
        "actor_queue_wait_metric_dropped",
        "podrace/actor.py",
        'rollout.timings["queue_put_wait"] = self.out.put(rollout)',
        "self.out.put(rollout)",
        ACTOR_TESTS,
    ),
    Mutant(
        "actor_truncated_episode_returns_dropped",
        "podrace/actor.py",
        "returns.append(step.episode_return[step.episode_done])",
        "returns.append(step.episode_return[step.terminated])",
        ACTOR_TESTS,
    ),
    Mutant(
        "actor_bootstraps_from_the_last_step_obs",
        "podrace/actor.py",
        "last_value = self.policy.value(params, last_obs)",
        "last_value = self.policy.value(params, obs_dev)",
        ACTOR_TESTS,
    ),
    # --- fused_rollout.py / the envpool XLA step ---------------------------------------------
    Mutant(
        "fused_valid_on_autoreset_steps",
        "podrace/fused_rollout.py",
        "valid = ~carry.prev_done",
        "valid = carry.prev_done | True",
        FUSED_TESTS,
    ),
    Mutant(
        "fused_truncation_not_an_autoreset",
        "podrace/fused_rollout.py",
        "    done = step.terminated | step.truncated\n    return EnvCarry(",
        "    done = step.terminated\n    return EnvCarry(",
        FUSED_TESTS,
    ),
    Mutant(
        "fused_bootstraps_from_the_first_obs",
        "podrace/fused_rollout.py",
        "last_value = policy.value(params, carry.obs)",
        "last_value = policy.value(params, obs[0])",
        FUSED_TESTS,
    ),
    Mutant(
        "fused_key_not_carried",
        "podrace/fused_rollout.py",
        "action, logprob, value, key = policy.step(params, carry.obs, key)",
        "action, logprob, value, _ = policy.step(params, carry.obs, key)",
        FUSED_TESTS,
    ),
    Mutant(
        "fused_chunk_returns_before_it_ran",
        "podrace/fused_rollout.py",
        "jax.block_until_ready(self._chunks[steps](params, key, self.carry))",
        "self._chunks[steps](params, key, self.carry)",
        FUSED_TESTS,
    ),
    Mutant(
        "fused_last_call_returns_before_it_ran",
        "podrace/fused_rollout.py",
        "key, self.carry, out = jax.block_until_ready(",
        "key, self.carry, out = (",
        FUSED_TESTS,
    ),
    Mutant(
        "episode_stats_unpacked_as_ints",
        "podrace/fused_rollout.py",
        "packed[1].view(np.float32)",
        "packed[1].astype(np.float32)",
        FUSED_TESTS,
    ),
    Mutant(
        "place_keeps_a_tree_of_another_device",
        "podrace/sync/placement.py",
        "if isinstance(where, jax.Device) and on_device(tree, where):",
        "if isinstance(where, jax.Device):",
        ("tests/sync/test_placement.py",),
    ),
    Mutant(
        "place_returns_the_mesh_sharding",
        "podrace/sync/placement.py",
        "return jax.tree.map(_single_device_view, tree)",
        "return tree",
        ("tests/sync/test_placement.py",),
    ),
    Mutant(
        "atari_lost_life_ends_the_game",
        "podrace/envs/envpool_backend.py",
        'return terminated | game_over, truncated, info["reward"], game_over | truncated',
        'return terminated | game_over, truncated, info["reward"], terminated | game_over | '
        "truncated",
        ("tests/envs/test_atari.py",),
    ),
    Mutant(
        "episode_length_counts_autoreset_steps",
        "podrace/envs/episode_stats.py",
        "+ ~counts.autoreset",
        "+ 1",
        ("tests/envs/test_episode_stats.py", *FUSED_TESTS),
    ),
    # --- arguments.py ----------------------------------------------------------------------
    Mutant(
        "argument_error_keeps_the_help_text",
        "podrace/commands/arguments.py",
        "elif not text.startswith(_DROPPED):",
        "else:",
        ("tests/commands/test_arguments.py",),
    ),
    # --- pipeline.py -----------------------------------------------------------------------
    Mutant(
        "pipeline_accepts_negative_lag",
        "podrace/pipeline.py",
        "if lag > self.max_policy_lag or lag < 0:",
        "if lag > self.max_policy_lag:",
        PIPELINE_TESTS,
    ),
    Mutant(
        "pipeline_lag_bound_off_by_one",
        "podrace/pipeline.py",
        "if lag > self.max_policy_lag or lag < 0:",
        "if lag > self.max_policy_lag + 1 or lag < 0:",
        PIPELINE_TESTS,
    ),
    Mutant(
        "pipeline_sequence_allows_gaps",
        "podrace/pipeline.py",
        "if rollout.seq != self._expected_seq[actor_id]:",
        "if rollout.seq < self._expected_seq[actor_id]:",
        PIPELINE_TESTS,
    ),
    Mutant(
        "pipeline_sequence_not_advanced",
        "podrace/pipeline.py",
        "self._expected_seq[actor_id] += 1",
        "pass",
        PIPELINE_TESTS,
    ),
    Mutant(
        "pipeline_first_seq_ignored",
        "podrace/pipeline.py",
        "self._expected_seq = [first_seq] * num_actors",
        "self._expected_seq = [0] * num_actors",
        PIPELINE_TESTS,
    ),
    Mutant(
        "pipeline_lag_stats_from_first_actor",
        "podrace/pipeline.py",
        "lags = [learner_version - r.policy_version for r in batch]",
        "lags = [learner_version - batch[0].policy_version for r in batch]",
        PIPELINE_TESTS,
    ),
    Mutant(
        "queue_capacity_off_by_one",
        "podrace/pipeline.py",
        "while len(self._items) >= self._capacity:",
        "while len(self._items) > self._capacity:",
        PIPELINE_TESTS,
    ),
    Mutant(
        "queue_full_put_ignores_stop",
        "podrace/pipeline.py",
        "while len(self._items) >= self._capacity:\n                self._lifetime.check()\n",
        "while len(self._items) >= self._capacity:\n",
        PIPELINE_TESTS,
    ),
    Mutant(
        "placing_sink_puts_the_unplaced_rollout",
        "podrace/pipeline.py",
        "return self.pipeline.put(dataclasses.replace(rollout, trajectory=placed))",
        "return self.pipeline.put(rollout)",
        PIPELINE_TESTS,
    ),
    # --- learner.py ------------------------------------------------------------------------
    Mutant(
        "learner_keys_not_advanced",
        "podrace/learner.py",
        "        self.keys = keys\n        finite = ",
        "        finite = ",
        LEARNER_FAKES,
    ),
    Mutant(
        "learner_publishes_nonfinite_update",
        "podrace/learner.py",
        'finite = bool(metrics.pop("finite"))',
        'finite = bool(metrics.pop("finite")) or True',
        LEARNER_FAKES,
    ),
    Mutant(
        "learner_accepts_nonfinite_statistics",
        "podrace/learner.py",
        "        if finite and stats_finite:",
        "        if finite:",
        LEARNER_FAKES,
    ),
    Mutant(
        "learner_skip_limit_off_by_one",
        "podrace/learner.py",
        "if self.skipped > self.settings.max_skipped:",
        "if self.skipped >= self.settings.max_skipped:",
        LEARNER_FAKES,
    ),
    Mutant(
        "learner_publish_before_block_until_ready",
        "podrace/learner.py",
        "        jax.block_until_ready(state.params)\n",
        "",
        LEARNER_FAKES,
    ),
    Mutant(
        "learner_env_steps_miscounted",
        "podrace/learner.py",
        'm.count("env_steps", self.settings.steps_per_update)',
        'm.count("env_steps", 1)',
        LEARNER_FAKES,
    ),
    Mutant(
        "learner_episodes_of_one_actor_only",
        "podrace/learner.py",
        "        for r in rollouts:\n",
        "        for r in rollouts[:1]:\n",
        LEARNER_FAKES,
    ),
    Mutant(
        "learner_lag_metrics_dropped",
        "podrace/learner.py",
        'm.set("lag/max_seen", max(m.last("lag/max_seen", 0.0), lag["lag_max"]))',
        'm.set("lag/max_seen", lag["lag_max"])',
        LEARNER_FAKES,
    ),
    # --- learner_mesh.py -------------------------------------------------------------------
    Mutant(
        "placement_splits_along_time",
        "podrace/learner_mesh.py",
        "jnp.split(x, n, axis=env_axis(name))",
        "jnp.split(x, n, axis=0)",
        (
            "tests/test_learner_mesh.py::test_placement_gives_each_learner_device_its_slice_of_the_envs",
        ),
    ),
    Mutant(
        "env_keys_laid_out_actor_major",
        "podrace/learner_mesh.py",
        "            for j in range(d * per_shard, (d + 1) * per_shard)\n"
        "            for a in range(num_actors)\n",
        "            for a in range(num_actors)\n"
        "            for j in range(d * per_shard, (d + 1) * per_shard)\n",
        ("tests/test_learner_mesh.py::test_an_envs_key_does_not_depend_on_the_learner_count",),
    ),
    # --- algos/common.py (the finite check the learner relies on) ---------------------------
    Mutant(
        "nonfinite_check_on_loss_only",
        "podrace/algos/common.py",
        'finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)',
        'finite = jnp.isfinite(metrics["loss"])',
        ("tests/algos/test_updates.py", "-k", "finite_loss or minibatch_step"),
    ),
    Mutant(
        "nonfinite_any_instead_of_all",
        "podrace/algos/common.py",
        'out["finite"] = jnp.all(stacked["finite"])',
        'out["finite"] = jnp.any(stacked["finite"])',
        ("tests/algos/test_updates.py", "-k", "finite_loss or minibatch_step"),
    ),
    # --- control.py ------------------------------------------------------------------------
    Mutant(
        "control_call_skips_stop_check",
        "podrace/control.py",
        "        self.lifetime.check()\n        self.heartbeat.enter(what, step, steps)",
        "        self.heartbeat.enter(what, step, steps)",
        ACTOR_TESTS + CONTROL_TESTS,
    ),
    Mutant(
        "heartbeat_not_exited",
        "podrace/control.py",
        "        finally:\n            self.heartbeat.exit()",
        "        finally:\n            pass",
        CONTROL_TESTS,
    ),
    Mutant(
        "watchdog_compares_the_wrong_way",
        "podrace/control.py",
        "now - since > limit",
        "now - since < limit",
        CONTROL_TESTS,
    ),
    Mutant(
        "watchdog_stops_without_failing",
        "podrace/control.py",
        "self.lifetime.fail(beat.component, HangDetected(message))",
        "self.lifetime.stop(message)",
        CONTROL_TESTS,
    ),
    Mutant(
        "lifetime_later_failure_wins",
        "podrace/control.py",
        "            if self.failure is None:\n                failure",
        "            if True:\n                failure",
        CONTROL_TESTS,
    ),
    Mutant(
        "lifetime_stop_runs_no_callbacks",
        "podrace/control.py",
        "        for callback in callbacks:\n            callback()",
        "        pass",
        CONTROL_TESTS + ("tests/test_pipeline.py::test_stop_wakes_blocked_put_and_get",),
    ),
    Mutant(
        "lifetime_on_stop_after_stop_is_lost",
        "podrace/control.py",
        "                return\n        callback()",
        "                return",
        CONTROL_TESTS,
    ),
    # --- runtime/threads.py ----------------------------------------------------------------
    Mutant(
        "threads_channel_closed_swallowed",
        "podrace/runtime/threads/group.py",
        "                if not self.lifetime.stopping:\n                    self.lifetime.fail(",
        "                if False:\n                    self.lifetime.fail(",
        THREADS_TESTS,
    ),
    Mutant(
        "threads_stop_reported_as_failure",
        "podrace/runtime/threads/group.py",
        "            except Stopped:\n"
        "                return  # the run is stopping; whoever stopped it recorded why\n",
        "",
        THREADS_TESTS,
    ),
    Mutant(
        "threads_no_transfer_guard",
        "podrace/runtime/threads/group.py",
        'with jax.transfer_guard("disallow"):',
        'with jax.transfer_guard("allow"):',
        THREADS_TESTS,
    ),
    # --- runtime/build.py (seeds, the learner's compile options) ----------------------------
    Mutant(
        "build_same_env_seed_for_every_actor",
        "podrace/runtime/build.py",
        "env_seed(cfg.seed, 0, global_id, *later)",
        "env_seed(cfg.seed, 0, 0, *later)",
        ("tests/runtime/test_build.py",),
    ),
    Mutant(
        "build_same_policy_key_for_every_actor",
        "podrace/runtime/build.py",
        "seed_key(cfg.seed, 2, (cfg.distributed.process_id or 0) * cfg.num_actors + actor_id)",
        "seed_key(cfg.seed, 2, (cfg.distributed.process_id or 0) * cfg.num_actors)",
        ("tests/runtime/test_build.py",),
    ),
    Mutant(
        "build_env_seed_ignores_run_seed",
        "podrace/runtime/build.py",
        "np.random.SeedSequence([seed, stream, actor_id, *more])",
        "np.random.SeedSequence([stream, actor_id, *more])",
        ("tests/runtime/test_build.py",),
    ),
    Mutant(
        "build_evaluator_shares_actor_0_envs",
        "podrace/runtime/build.py",
        "env_seed(cfg.seed, 1, 0)",
        "env_seed(cfg.seed, 0, 0)",
        ("tests/runtime/test_build.py",),
    ),
    Mutant(
        "build_learner_programs_on_the_default_schedule",
        "podrace/runtime/build.py",
        "    options = learner_compiler_options(cfg.network, mesh)\n",
        "    options = None\n",
        ("tests/runtime/test_build.py",),
    ),
    Mutant(
        "build_normalization_on_the_default_schedule",
        "podrace/runtime/build.py",
        "mesh, normalizer, cfg.num_actors, options",
        "mesh, normalizer, cfg.num_actors",
        ("tests/runtime/test_build.py",),
    ),
    # --- sync/local.py, versions.py ---------------------------------------------------------
    Mutant(
        "local_poll_repeats_the_acked_version",
        "podrace/sync/local.py",
        "self._newest(-1 if self._acked is None else self._acked + 1)",
        "self._newest(-1 if self._acked is None else self._acked)",
        LOCAL_CONFORMANCE,
    ),
    Mutant(
        "local_close_wakes_nobody",
        "podrace/sync/local.py",
        "                subscriber._last = None  # nothing more to return: every reference goes\n"
        "            self._cond.notify_all()",
        "                subscriber._last = None  # nothing more to return: every reference goes\n",
        LOCAL_CONFORMANCE,
    ),
    Mutant(
        "local_failed_publisher_looks_closed",
        "podrace/sync/local.py",
        "        if self._error is not None:\n            return PublisherGone",
        "        if False:\n            return PublisherGone",
        LOCAL_CONFORMANCE + ("tests/sync/test_relay.py",),
    ),
    Mutant(
        "local_placement_per_subscriber",
        "podrace/sync/local.py",
        "return entry.derived(where, lambda: self._place(host, where))",
        "return self._place(host, where)",
        ("tests/sync/test_local.py",),
    ),
    Mutant(
        "versions_negative_explicit_accepted",
        "podrace/sync/versions.py",
        "    if version < 0:",
        "    if version < -1:",
        LOCAL_CONFORMANCE,
    ),
    Mutant(
        "versions_equal_explicit_accepted",
        "podrace/sync/versions.py",
        "version <= self.latest:",
        "version < self.latest:",
        LOCAL_CONFORMANCE,
    ),
    Mutant(
        "transform_failure_not_counted",
        "podrace/sync/versions.py",
        "                self.failures += 1\n",
        "",
        LOCAL_CONFORMANCE,
    ),
    # --- sync/ray_board.py (the ray transport's board) ---------------------------------------
    Mutant(
        "ray_board_ack_can_go_back",
        "podrace/sync/ray_board.py",
        "state.acks[subscriber] = max(state.acks.get(subscriber, -1), version)",
        "state.acks[subscriber] = version",
        ("tests/sync/test_ray_board.py",),
    ),
    Mutant(
        "ray_board_wait_is_no_heartbeat",
        "podrace/sync/ray_board.py",
        "state.heard_from(subscriber, name, timeout + grace)",
        "state.heard_from(subscriber, name, grace)",
        ("tests/sync/test_ray_board.py",),
    ),
    Mutant(
        "ray_board_copies_share_a_label",
        "podrace/sync/ray_board.py",
        "            while label in taken:",
        "            while False:",
        ("tests/sync/test_ray_board.py",),
    ),
    # --- sync/background.py (shm and ray publishers) ------------------------------------------
    Mutant(
        "background_transform_failure_ends_delivery",
        "podrace/sync/background.py",
        "                        self._cond.notify_all()\n                    continue",
        "                        self._cond.notify_all()\n                    return",
        SHM_CONFORMANCE,
    ),
    Mutant(
        "background_flush_waits_for_visible",
        "podrace/sync/background.py",
        "self._settled == self._versions.latest",
        "self._visible == self._versions.latest",
        SHM_CONFORMANCE,
    ),
    Mutant(
        "background_publish_after_failure",
        "podrace/sync/background.py",
        "            if self._failure is not None:\n"
        '                raise SyncError(f"{self._label} delivery failed; channel closed") from '
        "self._failure\n"
        "            self._check(params)",
        "            self._check(params)",
        ("tests/sync/test_shm.py::test_publish_after_a_failed_delivery_raises",),
    ),
    # --- sync/shm_layout.py, shm.py ---------------------------------------------------------
    Mutant(
        "shm_slot_version_check_removed",
        "podrace/sync/shm_layout.py",
        "if seq & 1 or self.ctl[seq_w + 1] != version:",
        "if seq & 1:",
        SHM_LAYOUT,
    ),
    Mutant(
        "shm_sequence_not_rechecked_after_copy",
        "podrace/sync/shm_layout.py",
        "if self.ctl[seq_w] == seq:",
        "if True:",
        SHM_LAYOUT,
    ),
    Mutant(
        "shm_buffer_reused_while_viewed",
        "podrace/sync/shm_subscriber.py",
        "sys.getrefcount(owner) <= 3",
        "sys.getrefcount(owner) <= 4",
        ("tests/sync/test_shm.py", "-k", "reused_only_when or single_leaf"),
    ),
    Mutant(
        "shm_snapshot_writable",
        "podrace/sync/shm_subscriber.py",
        "buf.flags.writeable = False",
        "buf.flags.writeable = True",
        ("tests/sync/test_shm.py::test_snapshots_are_read_only_host_copies",),
    ),
    Mutant(
        "shm_failed_channel_reported_as_closed",
        "podrace/sync/shm_subscriber.py",
        "if state == CLOSED_FAILED:\n            raise PublisherGone(",
        "if state == CLOSED_FAILED:\n            raise ChannelClosed(",
        SHM_CONFORMANCE,
    ),
    # --- sync/transforms.py, relay.py, shm_sweep.py -------------------------------------------
    Mutant(
        "transform_cast_casts_integers",
        "podrace/sync/transforms.py",
        "if floating_only and not np.issubdtype",
        "if not floating_only and np.issubdtype",
        ("tests/sync/test_transforms.py",),
    ),
    Mutant(
        "relay_upstream_death_swallowed",
        "podrace/sync/relay.py",
        "        except PublisherGone as exc:  # the upstream died or failed: not a normal end\n"
        "            self.error = exc",
        "        except PublisherGone as exc:  # the upstream died or failed: not a normal end\n"
        "            pass",
        LOCAL_CONFORMANCE + ("tests/sync/test_relay.py",),
    ),
    Mutant(
        "relay_downstream_left_open",
        "podrace/sync/relay.py",
        "            elif self._close_target:\n                self.target.close()",
        "            elif self._close_target:\n                pass",
        ("tests/sync/test_relay.py",),
    ),
    Mutant(
        "shm_sweep_dry_run_removes",
        "podrace/sync/shm_sweep.py",
        "swept = sweep_shm(dry_run=args.dry_run)",
        "swept = sweep_shm()",
        ("tests/sync/test_shm.py", "-k", "sweep"),
    ),
    # --- evaluate.py -------------------------------------------------------------------------
    Mutant(
        "evaluate_step_not_watched",
        "podrace/evaluate.py",
        'step = control.call("evaluation env.step", steps, env.step, action)',
        "step = env.step(action)",
        EVALUATE_TESTS,
    ),
    Mutant(
        "evaluate_counts_past_an_envs_quota",
        "podrace/evaluate.py",
        "counted = done & (ended_so_far <= self.quota)",
        "counted = done",
        EVALUATE_TESTS,
    ),
    Mutant(
        "evaluate_tally_forgets_earlier_steps",
        "podrace/evaluate.py",
        "self.finished = ended_so_far[-1]",
        "self.finished = np.cumsum(done, axis=0)[-1]",
        EVALUATE_TESTS,
    ),
    Mutant(
        "evaluate_waits_forever_for_an_endless_env",
        "podrace/evaluate.py",
        "        if stuck.any():\n",
        "        if False:\n",
        EVALUATE_TESTS,
    ),
    Mutant(
        "evaluate_final_waits_through_a_stop",
        "podrace/evaluate.py",
        "        self.lifetime.on_stop(request.done.set)\n",
        "",
        EVALUATE_TESTS,
    ),
    # --- validation.py ---------------------------------------------------------------------
    Mutant(
        "shm_subscriber_channel_name_unchecked",
        "podrace/sync/shm_subscriber.py",
        "        check_channel_name(channel)  # ",
        "        # ",
        ("tests/sync/test_shm.py", "-k", "channel_name_no_socket"),
    ),
    Mutant(
        "config_types_from_python_unchecked",
        "podrace/validation.py",
        '    """Raise ConfigError for anything that cannot run; needs no devices and no JAX."""\n'
        "    check_types(cfg)\n",
        '    """Raise ConfigError for anything that cannot run; needs no devices and no JAX."""\n',
        ("tests/test_validation.py", "-k", "from_python"),
    ),
    Mutant(
        "numpy_int_seed_accepted",
        "podrace/config_dict.py",
        "        return isinstance(value, int) and not isinstance(value, bool)",
        "        return isinstance(value, int) and not isinstance(value, bool) or hasattr(value, "
        "'__index__')",
        ("tests/test_validation.py", "-k", "from_python"),
    ),
    Mutant(
        "config_impala_minibatches_unchecked",
        "podrace/validation.py",
        "elif envs_per_shard % cfg.impala.num_minibatches:",
        "elif False:",
        ("tests/test_config.py", "-k", "bad_preset_config and impala"),
    ),
    Mutant(
        "config_negative_lag_accepted",
        "podrace/validation.py",
        'non_negative("layout.max_policy_lag", cfg.layout.max_policy_lag)',
        "pass",
        ("tests/test_config.py", "-k", "max-policy-lag"),
    ),
    # --- runtime/rendezvous.py, peers.py ------------------------------------------------------
    Mutant(
        "rendezvous_accepts_a_wrong_process_count",
        "podrace/runtime/multihost/rendezvous.py",
        'elif hello.get("num_processes") != num_processes:',
        "elif False:",
        ("tests/runtime/test_rendezvous.py",),
    ),
    Mutant(
        "rendezvous_answers_ok_for_a_process_that_left",
        "podrace/runtime/multihost/rendezvous.py",
        "            gone = sorted(p for p, conn in joined.items() if _closed(conn))",
        "            gone = []",
        ("tests/runtime/test_rendezvous.py",),
    ),
    Mutant(
        "rendezvous_answers_before_everyone_joined",
        "podrace/runtime/multihost/rendezvous.py",
        "while error is None and len(joined) < num_processes - 1:",
        "while error is None and len(joined) < 1:",
        ("tests/runtime/test_rendezvous.py",),
    ),
    Mutant(
        "peer_close_waits_for_its_blocked_reader",
        "podrace/runtime/multihost/peers.py",
        "            lambda: self.sock.shutdown(socket.SHUT_RDWR),\n"
        "            self.reader.close,\n",
        "            self.reader.close,\n"
        "            lambda: self.sock.shutdown(socket.SHUT_RDWR),\n",
        ("tests/runtime/test_peers.py", "-k", "close_returns"),
    ),
    Mutant(
        "peer_loss_overrides_its_own_stop",
        "podrace/runtime/multihost/peers.py",
        "or self._closed.is_set() or self._leaving:",
        "or self._closed.is_set():",
        ("tests/runtime/test_peers.py", "-k", "own_reason"),
    ),
    # --- train_command.py (signal flow) --------------------------------------------------------
    Mutant(
        "cli_signal_exit_code_not_conventional",
        "podrace/commands/train.py",
        "return 128 + self.signals.received",
        "return 1",
        ("tests/test_cli.py", "-k", "signal"),
    ),
    # --- runtime: closing envs, holding the run directory -----------------------------------
    Mutant(
        "env_close_error_propagates",
        "podrace/envs/closing.py",
        "except Exception as error:  # noqa: BLE001 - user code at shutdown",
        "except ZeroDivisionError as error:  # noqa: BLE001 - user code at shutdown",
        ("tests/runtime/test_threads.py", "-k", "close_envs"),
    ),
    Mutant(
        "final_line_before_the_final_save",
        "podrace/runtime/run.py",
        "                self.checkpoints.settle(FINAL_SAVE_WAIT_S)\n",
        "                pass\n",
        ("tests/runtime/test_resume.py", "-k", "final_metrics_line"),
    ),
    Mutant(
        "envs_closed_before_the_last_checkpoint",
        "podrace/runtime/run.py",
        "                self.checkpoints.close(lifetime)  # before user code (env.close) runs "
        "again\n"
        "                self.saving_last = False\n"
        "                unclosed = self.close_envs(exclude=stuck)\n",
        "                self.saving_last = False\n"
        "                unclosed = self.close_envs(exclude=stuck)\n"
        "                self.checkpoints.close(lifetime)\n",
        ("tests/runtime/test_shutdown.py", "-k", "close_that_raises"),
    ),
    Mutant(
        "run_lock_on_the_parent_directory",
        "podrace/runtime/run.py",
        "lock = RunLock(resume.run_dir)",
        "lock = RunLock(Path(resume.run_dir).parent)",
        ("tests/runtime/test_run_lock.py",),
    ),
    # --- checkpoints: a step being read survives the live run's rotation ---------------------
    Mutant(
        "rotation_ignores_a_readers_hold",
        "podrace/checkpoints/files.py",
        "                if not free:\n",
        "                if False:\n",
        ("tests/checkpoints/test_files.py", "-k", "rotation"),
    ),
    Mutant(
        "eval_reads_without_holding_the_step",
        "podrace/commands/eval.py",
        "            with step_lock(directory / str(step), shared=True):",
        '            with step_lock(directory / "no such step", shared=True):',
        ("tests/commands/test_eval.py", "-k", "rotating"),
    ),
    Mutant(
        "no_last_rotation_at_close",
        "podrace/checkpoints/files.py",
        "            self.wait()\n"
        "            if self.writers.primary:\n"
        "                self.rotate()\n",
        "            self.wait()\n",
        ("tests/checkpoints/test_files.py", "-k", "last_save"),
    ),
    Mutant(
        "step_appears_before_its_manifest",
        "podrace/checkpoints/files.py",
        "                write_manifest(partial)\n                os.rename(partial, final)",
        "                os.rename(partial, final)\n                write_manifest(final)",
        ("tests/checkpoints/test_files.py", "-k", "appears_only_with_its_manifest"),
    ),
    Mutant(
        "rotation_deletes_a_step_in_place",
        "podrace/checkpoints/files.py",
        "                    os.rename(step_dir, doomed)\n"
        "                    shutil.rmtree(doomed)",
        "                    shutil.rmtree(step_dir)",
        ("tests/checkpoints/test_files.py", "-k", "rotated_step"),
    ),
    Mutant(
        "leftovers_of_killed_writes_kept",
        "podrace/checkpoints/files.py",
        "            shutil.rmtree(leftover, ignore_errors=True)",
        "            pass",
        ("tests/checkpoints/test_files.py", "-k", "rotated_step"),
    ),
    Mutant(
        "resume_reads_a_live_runs_checkpoints",
        "podrace/commands/train.py",
        "    RunLock(resume.run_dir).release()",
        "    RunLock",
        ("tests/commands/test_train_resume.py", "-k", "in_use"),
    ),
    # --- mixed: sync layouts, stops and signals, resume, determinism, one-line errors ------
    Mutant(
        "local_carries_a_changed_layout",
        "podrace/sync/local.py",
        "            self._layout.check(params)\n",
        "",
        ("tests/sync/test_conformance.py", "-k", "another_layout and local"),
    ),
    Mutant(
        "shm_takes_python_object_leaves",
        "podrace/sync/shm.py",
        '        spec.check_fixed_size("published params")\n',
        "",
        ("tests/sync/test_shm.py", "-k", "object_leaves"),
    ),
    Mutant(
        "stop_while_resuming_is_a_failure",
        "podrace/runtime/run.py",
        "        raise_stopped_if_stopping(lifetime, error)\n",
        "",
        ("tests/runtime/test_resume.py", "-k", "resumed_run_is_built"),
    ),
    Mutant(
        "unresumable_run_dir_kept_after_an_early_stop",
        "podrace/runtime/run.py",
        "if self._discarded():\n                remove_run_dir(lifetime.run_dir)",
        "if self._discarded():\n                pass",
        ("tests/runtime/test_single_host.py", "-k", "before_the_first_update"),
    ),
    Mutant(
        "library_ctrl_c_raised_inside_jax",
        "podrace/runtime/interrupts.py",
        "or signal.getsignal(signal.SIGINT) is not signal.default_int_handler",
        "or signal.getsignal(signal.SIGINT) is signal.default_int_handler or True",
        ("tests/test_api.py", "-k", "ctrl_c"),
    ),
    Mutant(
        "second_ctrl_c_keeps_the_run_locked",
        "podrace/runtime/run.py",
        "            if self.lock is not None:\n                self.lock.release()\n",
        "",
        ("tests/test_api.py", "-k", "ctrl_c"),
    ),
    Mutant(
        "resume_from_python_needs_the_run_name",
        "podrace/checkpoints/resume.py",
        "    cfg = stored if cfg is None else replace(cfg, **where)",
        "    cfg = stored if cfg is None else cfg",
        ("tests/test_api.py", "-k", "ctrl_c"),
    ),
    Mutant(
        "failing_close_of_a_rejected_env_hides_why",
        "podrace/envs/source.py",
        'close_envs(\n                [(f"env factory {name!r}", made)]\n            )',
        "made.close()",
        ("tests/envs/test_source.py", "-k", "rejected_vector_env"),
    ),
    Mutant(
        "library_deterministic_run_without_gpu_kernels",
        "podrace/runtime/run.py",
        "        deterministic_gpu_ops()\n",
        "        pass\n",
        ("tests/runtime/test_xla_setup.py", "-k", "deterministic"),
    ),
    Mutant(
        "deterministic_gpu_backend_started_without_the_flag_accepted",
        "podrace/runtime/xla_setup.py",
        '    raise ConfigError(\n        f"deterministic needs',
        '    return ConfigError(\n        f"deterministic needs',
        ("tests/runtime/test_xla_setup.py", "-k", "deterministic"),
    ),
    Mutant(
        "exit_flushes_a_closed_stdout",
        "podrace/commands/std_streams.py",
        "            if stream is not None:\n                stream.flush()",
        "            stream.flush()",
        ("tests/commands/test_std_streams.py", "-k", "exits_flush"),
    ),
    Mutant(
        "config_choice_compared_elementwise",
        "podrace/config_dict.py",
        "        return isinstance(value, (str, int, float, type(None))) and value in args",
        "        return value in args",
        ("tests/test_validation.py", "-k", "from_python"),
    ),
    Mutant(
        "command_process_finalized",
        "podrace/cli.py",
        "        ignore_signals_from_now_on()\n        leave(code)\n",
        "        ignore_signals_from_now_on()\n",
        ("tests/test_cli.py", "-k", "without_finalization"),
    ),
    Mutant(
        "eval_and_plot_signals_raise_keyboard_interrupt",
        "podrace/cli.py",
        "        with exit_at_once_on_signals():",
        "        if True:",
        ("tests/test_cli.py", "-k", "signal_ends_eval"),
    ),
    Mutant(
        "exit_in_the_middle_of_an_output_write",
        "podrace/commands/supervisor.py",
        "    handler.writing += 1\n",
        "    handler.writing += 0\n",
        ("tests/test_cli.py", "-k", "signal_ends_eval and while"),
    ),
    Mutant(
        "ray_workers_beyond_the_cluster_accepted",
        "podrace/runtime/ray/cluster.py",
        "    if fits < wanted:",
        "    if fits < 0:",
        ("tests/runtime/test_ray_cluster.py",),
    ),
    Mutant(
        "deleted_checkpoint_files_not_named",
        "podrace/checkpoints/files.py",
        "if missing or not (refused",
        "if False and (refused",
        ("tests/checkpoints/test_files.py", "-k", "deleted_under"),
    ),
    Mutant(
        "signal_after_a_command_kills_silently",
        "podrace/cli.py",
        "        ignore_signals_from_now_on()\n",
        "        pass\n",
        ("tests/test_cli.py", "-k", "signal_around"),
    ),
    Mutant(
        "second_signal_keeps_an_untrained_run_dir",
        "podrace/commands/train.py",
        "        signals.before_exit = self.discard_untrained_run_dir\n",
        "",
        ("tests/test_cli.py", "-k", "second_signal"),
    ),
    # --- checkpoints: the atomic manifest, leftovers, failed writes ------------------------
    Mutant(
        "leftovers_matched_by_prefix",
        "podrace/checkpoints/steps.py",
        "        if not _LEFTOVER.fullmatch(path.name):",
        "        if not _LEFTOVER.match(path.name):",
        ("tests/checkpoints/test_files.py", "-k", "rotated_step"),
    ),
    Mutant(
        "a_file_in_the_way_of_a_step_ignored",
        "podrace/checkpoints/steps.py",
        "        if path.is_symlink() or not path.is_dir():\n            raise",
        "        if False:\n            raise",
        ("tests/checkpoints/test_files.py", "-k", "rotated_step"),
    ),
    Mutant(
        "resume_finds_a_name_in_the_way_after_changing_the_run",
        "podrace/checkpoints/resume.py",
        "    leftovers(_checkpoints(run_dir))  # a name in the way",
        "    (_checkpoints(run_dir))  # a name in the way",
        ("tests/commands/test_train_resume.py", "-k", "errors_are_one_line"),
    ),
    Mutant(
        "step_counted_as_saved_after_the_rotation",
        "podrace/checkpoints/files.py",
        '        self.metrics.set("checkpoint/version", step)  # complete: whatever happens '
        "to the rotation\n"
        "        if primary:\n"
        "            self.rotate()\n",
        "        if primary:\n"
        "            self.rotate()\n"
        '        self.metrics.set("checkpoint/version", step)\n',
        ("tests/checkpoints/test_files.py", "-k", "synced"),
    ),
    Mutant(
        "manifest_not_synced",
        "podrace/checkpoints/manifest.py",
        "        os.fsync(f.fileno())\n",
        "",
        ("tests/checkpoints/test_files.py", "-k", "synced"),
    ),
    Mutant(
        "orbax_failure_tracebacks_printed",
        "podrace/checkpoints/files.py",
        'logging.getLogger("absl").addFilter(self._quiet)',
        "pass",
        ("tests/checkpoints/test_files.py", "-k", "storage_refuses"),
    ),
    Mutant(
        "failed_write_closes_loops_under_late_callbacks",
        "podrace/checkpoints/files.py",
        "with draining_loops():",
        "with contextlib.nullcontext():",
        ("tests/checkpoints/test_files.py", "-k", "storage_refuses"),
    ),
    Mutant(
        "failed_write_keeps_its_space",
        "podrace/checkpoints/files.py",
        "shutil.rmtree(path, ignore_errors=True)",
        "pass",
        ("tests/checkpoints/test_files.py", "-k", "disk_full"),
    ),
    Mutant(
        "files_outside_the_manifest_accepted",
        "podrace/checkpoints/read.py",
        "path.relative_to(step_dir).as_posix() not in files",
        "path.relative_to(step_dir).as_posix() not in files and False",
        ("tests/checkpoints/test_files.py", "-k", "unlisted"),
    ),
    Mutant(
        "manifest_format_unchecked",
        "podrace/checkpoints/read.py",
        '    if manifest.get("format") != FORMAT:',
        "    if False:",
        ("tests/checkpoints/test_files.py", "-k", "other-format"),
    ),
    Mutant(
        "step_without_a_manifest_read_unverified",
        "podrace/checkpoints/read.py",
        "    if not manifest_path.is_file():\n        raise",
        "    if not manifest_path.is_file():\n        return\n        raise",
        ("tests/commands/test_eval.py", "-k", "without_its_manifest"),
    ),
    # --- the other presets: normalizer, float settings, torsos, Atari images, results ------
    Mutant(
        "normalizer_statistics_finite_per_shard_only",
        "podrace/algos/normalizer.py",
        "        finite = jax.lax.pmin(finite.astype(jnp.int32), axis_name) > 0\n",
        "        pass\n",
        ("tests/algos/test_normalizer.py", "-k", "non_finite"),
    ),
    Mutant(
        "normalizer_statistics_never_checked",
        "podrace/algos/normalizer.py",
        "    return normalizer, trajs, finite\n",
        "    return normalizer, trajs, jnp.bool_(True)\n",
        ("tests/algos/test_normalizer.py", "-k", "non_finite"),
    ),
    Mutant(
        "float_settings_beyond_float32_accepted",
        "podrace/validation.py",
        "abs(item) > FLOAT32_MAX",
        "abs(item) > math.inf",
        ("tests/test_validation.py", "-k", "finiteness"),
    ),
    Mutant(
        "torso_without_inputs_accepted",
        "podrace/runtime/memory.py",
        "        if math.prod(leaf.shape) == 0:",
        "        if False:",
        ("tests/test_config.py", "-k", "atari"),
    ),
    Mutant(
        "atari_image_size_unbounded",
        "podrace/envs/envpool_backend.py",
        "        if cfg.image_size > MAX_ATARI_IMAGE_SIZE:",
        "        if False:",
        ("tests/test_config.py", "-k", "atari"),
    ),
    Mutant(
        "standardized_images_divided_by_255",
        "podrace/networks/torsos.py",
        "    if jnp.issubdtype(obs.dtype, jnp.integer):",
        "    if True:",
        ("tests/networks/test_networks.py", "-k", "float"),
    ),
    Mutant(
        "nan_written_into_result_json",
        "podrace/json_text.py",
        "        return value if math.isfinite(value) else None",
        "        return value",
        ("tests/test_json_text.py",),
    ),
    Mutant(
        "resumed_tracker_mid_episode",
        "podrace/runtime/build.py",
        "            normalizer = normalizer._replace(tracker=fresh.tracker)",
        "            pass",
        ("tests/runtime/test_resume.py", "-k", "straight_run"),
    ),
    Mutant(
        "envpool_step_keeps_its_effect",
        "podrace/envs/envpool_backend.py",
        '**{**kwargs, "has_side_effect": False}',
        "**kwargs",
        ("tests/envs/test_envpool_backend.py",),
    ),
    Mutant(
        "one_point_curve_drawn_invisibly",
        "podrace/metrics/plot.py",
        '        single = "o" if len(steps) == 1 else None',
        "        single = None",
        ("tests/metrics/test_plot.py", "-k", "one_metrics_line"),
    ),
    # --- multi-host, Ray and sync ----------------------------------------------------------
    Mutant(
        "preemption_notifier_takes_sigterm",
        "podrace/runtime/multihost/distributed.py",
        '    jax.config.update("jax_enable_preemption_service", False)\n',
        "",
        ("tests/runtime/test_multihost.py", "-k", "signal_to_one and SIGTERM"),
    ),
    Mutant(
        "hub_never_says_all_done",
        "podrace/runtime/multihost/peers.py",
        "        if self.process_id == 0:\n            self._check_all_done()",
        "        if self.process_id == 0:\n            pass",
        ("tests/runtime/test_peers.py",),
    ),
    Mutant(
        "spoke_leaves_without_waiting_for_process_0",
        "podrace/runtime/multihost/topology.py",
        "while not link.wait_all_done(0.05):",
        "while False:",
        ("tests/runtime/test_multihost.py", "-k", "final_evaluation"),
    ),
    Mutant(
        "done_then_killed_is_no_loss",
        "podrace/runtime/multihost/peers.py",
        "                if not self._all_done.is_set() and not self._closed.is_set() and not "
        "conn.refused:",
        "                if not conn.done and not self._closed.is_set() and not conn.refused:",
        ("tests/runtime/test_peers.py", "-k", "done_then_gone"),
    ),
    Mutant(
        "hub_exits_before_the_others",
        "podrace/runtime/multihost/peers.py",
        "        if self.process_id != 0:\n            return\n        deadline",
        "        if True:\n            return\n        deadline",
        ("tests/runtime/test_multihost.py", "-k", "no_run_directory"),
    ),
    Mutant(
        "run_dir_kept_after_a_failed_preparation",
        "podrace/runtime/run.py",
        "            remove_run_dir(lifetime.run_dir)\n        raise_stopped_if_stopping",
        "            pass\n        raise_stopped_if_stopping",
        ("tests/runtime/test_rundir.py", "-k", "fails_while_building"),
    ),
    # --- runtime/coordination_service.py ---------------------------------------------------
    Mutant(
        "coordination_service_inside_process_0",
        "podrace/runtime/multihost/coordination_service.py",
        "    lib.get_distributed_runtime_service = HostedService\n",
        "    lib.get_distributed_runtime_service = factory\n",
        ("tests/runtime/test_coordination_service.py", "-k", "killed"),
    ),
    Mutant(
        "coordination_service_in_process_0s_group",
        "podrace/runtime/multihost/coordination_service.py",
        "            start_new_session=True,",
        "            start_new_session=False,",
        ("tests/runtime/test_coordination_service.py", "-k", "killed or ctrl_c"),
    ),
    Mutant(
        "orphaned_coordination_service_never_exits",
        "podrace/runtime/multihost/coordination_service.py",
        "        time.sleep(LINGER_S)\n",
        "        time.sleep(3600)\n",
        ("tests/runtime/test_coordination_service.py", "-k", "killed"),
    ),
    Mutant(
        "stopped_process_0_leaves_its_service_lingering",
        "podrace/runtime/multihost/topology.py",
        "stop_hosted_service()  # process 0: the others have left",
        "pass  # process 0: the others have left",
        ("tests/runtime/test_multihost.py", "-k", "signal_to_one and SIGTERM"),
    ),
    Mutant(
        "process_0_lost_a_peer_while_preparing_keeps_its_service",
        "podrace/runtime/multihost/topology.py",
        "    stop_hosted_service()  # process 0: the coordinator's port is free again at once\n",
        "",
        ("tests/runtime/test_multihost.py", "-k", "first_update"),
    ),
    # --- the peer link before jax.distributed ----------------------------------------------
    Mutant(
        "peer_link_opens_only_after_jax_distributed",
        "podrace/runtime/multihost/topology.py",
        "        if hub is not None:  # every process is there",
        "        if False:  # every process is there",
        ("tests/runtime/test_multihost.py", "-k", "killed_while_joining"),
    ),
    Mutant(
        "refusing_process_is_a_lost_peer",
        "podrace/runtime/multihost/topology.py",
        "            self.link.report_refused()\n",
        "            pass\n",
        ("tests/runtime/test_multihost.py", "-k", "mismatch or layout_error"),
    ),
    Mutant(
        "refused_close_is_a_loss",
        "podrace/runtime/multihost/peers.py",
        " and not self._closed.is_set() and not conn.refused:",
        " and not self._closed.is_set():",
        ("tests/runtime/test_peers.py", "-k", "refuses"),
    ),
    Mutant(
        "spoke_makes_its_part_before_process_0_made_the_run_dir",
        "podrace/runtime/multihost/topology.py",
        "            cluster.get(_RUN_DIR_KEY)\n",
        "            pass\n",
        ("tests/runtime/test_multihost.py", "-k", "error_in_process_1"),
    ),
    Mutant(
        "stray_client_taken_for_a_process",
        "podrace/runtime/multihost/peers.py",
        "not isinstance(process, int) or process not in waiting",
        "False",
        ("tests/runtime/test_peers.py", "-k", "stray"),
    ),
    Mutant(
        "run_dir_kept_after_a_stop_elsewhere_before_any_update",
        "podrace/runtime/multihost/topology.py",
        "discard_if_untrained(run.lifetime.run_dir, run.learner.version)",
        "pass",
        ("tests/runtime/test_multihost.py", "-k", "process_0_trains_but_before"),
    ),
    Mutant(
        "coordination_service_unknown_until_spawned",
        "podrace/runtime/multihost/coordination_service.py",
        "        HostedService.current = self\n        child = subprocess.Popen(",
        "        child = subprocess.Popen(",
        ("tests/runtime/test_coordination_service.py", "-k", "while_its_service"),
    ),
    Mutant(
        "coordination_service_stopped_while_spawned_serves_a_moment",
        "podrace/runtime/multihost/coordination_service.py",
        "            stopped = self._stopped\n",
        "            stopped = False\n",
        ("tests/runtime/test_coordination_service.py", "-k", "child_is_spawned"),
    ),
    Mutant(
        "stopped_process_leaves_the_meeting_silently",
        "podrace/runtime/multihost/distributed.py",
        "            refuse(\n"
        "                *known,\n"
        '                f"it was stopped before every process had joined ({stop})",\n'
        "                STOP_REFUSAL_WAIT_S,\n"
        "            )\n",
        "",
        ("tests/runtime/test_distributed.py", "-k", "stopped_before"),
    ),
    Mutant(
        "refusal_after_hello_taken_for_a_twin",
        "podrace/runtime/multihost/rendezvous.py",
        "elif process in joined and isinstance(",
        "elif False and isinstance(",
        ("tests/runtime/test_rendezvous.py", "-k", "twin"),
    ),
    Mutant(
        "local_get_forgets_its_last_snapshot",
        "podrace/sync/local.py",
        "                    snapshot = self._last\n",
        "                    pass\n",
        ("tests/sync/test_conformance.py", "-k", "failing_transform and local"),
    ),
    Mutant(
        "ray_worker_dying_at_start_fails_the_run",
        "podrace/runtime/ray/topology.py",
        "                try:\n                    self._failed(slot, error)\n"
        "                except WorkerCrashLoop",
        "                try:\n                    raise WorkerCrashLoop(str(error))\n"
        "                except WorkerCrashLoop",
        ("tests/runtime/test_ray_runtime.py", "-k", "killed_while_it_starts"),
    ),
    Mutant(
        "ray_join_trusts_any_listener",
        "podrace/runtime/ray/cluster.py",
        "    if len(header) < 9 or header[3] != 4:",
        "    if False:",
        ("tests/runtime/test_ray_runtime.py", "-k", "something_else"),
    ),
    Mutant(
        "invalid_process_leaves_the_others_waiting",
        "podrace/runtime/multihost/rendezvous.py",
        '                    refused = f"distributed: process {process} cannot run: '
        "{hello['refusal']}\"",
        "                    pass",
        ("tests/runtime/test_multihost.py", "-k", "invalid_config"),
    ),
    Mutant(
        "shm_channel_name_unchecked",
        "podrace/sync/shm.py",
        "        check_channel_name(self.name)  # before any segment or socket exists\n",
        "",
        ("tests/sync/test_shm.py", "-k", "channel_name"),
    ),
    Mutant(
        "own_signal_loses_to_a_peers_stop",
        "podrace/commands/train.py",
        "                if self.signals.received:  # and on this one",
        "                if False:",
        ("tests/runtime/test_multihost.py", "-k", "signal_to_one and both"),
    ),
    Mutant(
        "result_line_refused_is_a_traceback",
        "podrace/commands/std_streams.py",
        "    except (OSError, ValueError) as error:  # ValueError: stdout closed",
        "    except ValueError as error:  # ValueError: stdout closed",
        (
            "tests/commands/test_std_streams.py",
            "tests/metrics/test_plot.py",
            "-k",
            "refuses or cli_plot",
        ),
    ),
    Mutant(
        "command_stderr_unguarded",
        "podrace/cli.py",
        "        guard_std_streams()\n",
        "",
        ("tests/test_cli.py", "-k", "outlives or closed_or_full"),
    ),
    Mutant(
        "stderr_that_refuses_ends_the_run",
        "podrace/commands/std_streams.py",
        "        except (OSError, ValueError):\n            return len(text)\n",
        "        except ZeroDivisionError:\n            return len(text)\n",
        ("tests/test_cli.py", "-k", "outlives"),
    ),
    Mutant(
        "stdout_closed_left_none_for_tyro",
        "podrace/commands/std_streams.py",
        '    if sys.stdout is None:\n        sys.stdout = open(1, "w", closefd=False)\n',
        "",
        ("tests/test_cli.py", "-k", "stdout_closed"),
    ),
    Mutant(
        "stderr_waits_for_a_reader_that_stopped_reading",
        "podrace/runtime/stderr.py",
        "if fd is None:",
        "if True:",
        ("tests/test_cli.py", "-k", "stopped_reading"),
    ),
    Mutant(
        "help_into_a_full_stdout_is_a_traceback",
        "podrace/commands/arguments.py",
        "    except OSError as error:  # only printing --help",
        "    except ZeroDivisionError as error:  # only printing --help",
        ("tests/test_cli.py", "-k", "help_into"),
    ),
    Mutant(
        "video_feeds_discrete_states_as_numbers",
        "podrace/video.py",
        "obs = obs if self.one_hot is None else self.one_hot(obs)",
        "obs = obs",
        ("tests/commands/test_eval.py", "-k", "discrete"),
    ),
    Mutant(
        "env_error_of_an_explained_cause_gets_a_traceback",
        "podrace/commands/train.py",
        "    return error.__cause__ is not None and explains_itself(error.__cause__)",
        "    return False",
        ("tests/test_cli.py", "-k", "named_failures and outside"),
    ),
    Mutant(
        "gymnasium_discrete_observations_fed_as_numbers",
        "podrace/envs/vector_adapter.py",
        "        if self._one_hot is not None:\n"
        "            obs = self._one_hot(obs)  # a new array\n"
        "        elif self._select is None:",
        "        if self._select is None:",
        ("tests/envs/test_discrete_obs.py",),
    ),
    Mutant(
        "envpool_discrete_observations_fed_as_numbers",
        "podrace/envs/envpool_backend.py",
        "            obs = self._one_hot(obs)\n        return obs if",
        "            pass\n        return obs if",
        ("tests/envs/test_discrete_obs.py",),
    ),
    Mutant(
        "fused_discrete_observations_fed_as_numbers",
        "podrace/envs/envpool_backend.py",
        "            obs = self._one_hot.jax(obs)\n",
        '            obs = obs.astype("float32")[:, None] * jnp.ones(self._one_hot.n)\n',
        ("tests/test_fused_rollout.py", "-k", "frozen"),
    ),
    Mutant(
        "one_hot_ignores_the_spaces_start",
        "podrace/envs/spaces.py",
        "        index = np.asarray(obs).astype(np.int64) - self.start\n",
        "        index = np.asarray(obs).astype(np.int64)\n",
        ("tests/envs/test_discrete_obs.py",),
    ),
    Mutant(
        "gymnasium_out_of_date_note_printed",
        "podrace/envs/__init__.py",
        'warnings.filterwarnings("ignore", message=r".*The environment \\S+ is out of date")',
        "pass",
        ("tests/test_cli.py", "-k", "dependency_warnings"),
    ),
    # --- recent: PPO's epochs, the sampling key chain, the recurrent reset, the last save ----
    Mutant(
        "ppo_same_minibatches_every_epoch",
        "podrace/algos/ppo.py",
        "jax.random.fold_in(k, epoch_index), num_steps)",
        "jax.random.fold_in(k, 0), num_steps)",
        ("tests/algos/test_minibatch_order.py", "-k", "none"),
    ),
    Mutant(
        "recurrent_ppo_same_minibatches_every_epoch",
        "podrace/algos/ppo.py",
        "jax.random.fold_in(k, epoch_index))(keys)",
        "jax.random.fold_in(k, 0))(keys)",
        ("tests/algos/test_minibatch_order.py", "-k", "lstm"),
    ),
    Mutant(
        "actor_sampling_key_never_advances",
        "podrace/actor.py",
        "return action, dist.log_prob(action), value, jax.random.key_data(key)",
        "return action, dist.log_prob(action), value, key_data",
        ("tests/test_sampling_noise.py",),
    ),
    Mutant(
        "recurrent_state_not_reset_after_an_autoreset",
        "podrace/networks/recurrent.py",
        "return jnp.where(keep, leaf, jnp.zeros_like(leaf))",
        "return leaf",
        ("tests/networks/test_recurrent.py", "-k", "reset_after_invalid or after_an_autoreset"),
    ),
    Mutant(
        "last_save_cut_short_at_the_exit_grace",
        "podrace/commands/supervisor.py",
        "run.saving_last and time.monotonic()",
        "run.saving_last and False and time.monotonic()",
        ("tests/runtime/test_last_save.py",),
    ),
]

# Considered and left out (equivalent or unobservable without asserting speed):
# - video.check_renderable rendering in this process instead of a child: the dying renderer
#   of its test would end the test process itself, not fail a test.
# - pipeline/PlacingSink without block_until_ready(placed): only moves where the wait is timed.
# - ThreadGroup.join with the full timeout per thread: only changes how long join may take.
# - ShmSubscriber.poll with `latest < acked`: the second version check after the read filters it.
# - make_update_fn using split[:, 0] for this update: keys still differ per update and per env.
# - ThreadGroup re-raising Stopped out of the thread: the run's outcome is unchanged (only
#   threading.excepthook prints it); dropping the `except Stopped` clause is listed instead.
# - LearnerPlacement.place passing every jax.Array rollout to place() (not only those on the
#   learner's device): place() itself moves one from another device there.
# - Ray topology's actors_start restoring next_seq=version: only the end-to-end resume of a
#   stopped Ray run (tests/runtime/test_ray_runtime.py, minutes) would catch it; no fast test.
# - Run._release not closing the checkpoint writer before it releases the lock: it matters
#   only when a second Ctrl-C cuts the stop short during a write; tests/test_api.py's Ctrl-C
#   test passed under it (the write was done by then), so it is not listed.
