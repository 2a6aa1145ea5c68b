"""The test files that cover each module of ``service/`` with no mirrored unit test file.

The layout (checked by tests/test_tests_layout.py): the unit tests of ``service/<path>/<name>.py``
are in ``tests/unit/<path>/test_<name>.py``, which imports it. A module without that file has an
entry here naming the test files that exercise it, the most direct first. Most such modules
are reached through an entry point rather than imported by a test: a route through the API suites
that call it, a command through the suite that runs it, a part of the ledger through the
``Ledger`` those suites use. A comment gives the reason where a suite's name does not. An
``__init__.py`` with no function or class in it only re-exports and needs no entry.

Found by the test files' imports and, for the modules reached only through the app, the CLI or the
ledger, by ``coverage run`` of one test file at a time (lines run inside the module's functions).
A module that runs only in a process a suite starts (``serve``, ``loadtest``, ``soak``, the batch
pool and Ray workers, the prefix table builder) is listed with the suites that start it.
"""

from __future__ import annotations

#: ``service/...py`` -> the test files (paths from the repository root) that cover it.
COVERING_SUITES: dict[str, tuple[str, ...]] = {
    # `python -m service` runs cli.main in a subprocess
    "service/__main__.py": ("tests/test_cli_errors.py", "tests/test_accounts_cli.py"),
    # the app factory every API suite builds
    "service/api/app.py": (
        "tests/test_api.py",
        "tests/test_openapi_clients.py",
        "tests/test_structural_cover.py",
    ),
    # the bodies both batch endpoints share
    "service/api/batch_base.py": ("tests/test_batch_api.py", "tests/test_embedding_batch_api.py"),
    # the request/answer models of POST /v1/ppr/batch
    "service/api/batch_models.py": ("tests/test_batch_api.py", "tests/test_api_strict.py"),
    "service/api/dashboard_models.py": (
        "tests/test_api_admin_dashboard.py",
        "tests/test_composed_figures.py",
    ),
    # authentication and key-type dependencies of every route
    "service/api/deps.py": ("tests/test_api.py", "tests/test_api_strict.py"),
    "service/api/embedding_batch_models.py": ("tests/test_embedding_batch_api.py",),
    # the error bodies every refusal returns
    "service/api/error_responses.py": ("tests/test_api_strict.py", "tests/test_client_rules.py"),
    "service/api/figures.py": ("tests/test_composed_figures.py",),
    "service/api/forked_workers.py": ("tests/test_graph_snapshot.py",),
    # the connection deadlines, driven over raw sockets
    "service/api/http_protocol.py": ("tests/test_http_connections.py",),
    "service/api/models.py": (
        "tests/test_api.py",
        "tests/test_api_strict.py",
        "tests/test_composed_figures.py",
    ),
    # the /metrics counters and request log lines
    "service/api/observability.py": ("tests/test_api.py", "tests/test_api_limits.py"),
    # serve's start-up warning when the open-file limit is too low
    "service/api/open_files.py": ("tests/test_http_connections.py",),
    # the served schema
    "service/api/openapi.py": ("tests/test_api_strict.py", "tests/test_openapi_clients.py"),
    # the admin page's static files
    "service/api/pages.py": ("tests/test_api_admin_dashboard.py", "tests/test_admin_browser.py"),
    "service/api/params.py": ("tests/test_api_edges.py",),
    "service/api/planning_models.py": ("tests/test_plan_api.py",),
    # GET /v1/admin/exposure, /charges, /audit, /graph
    "service/api/routes/admin.py": ("tests/test_api.py", "tests/test_api_admin_dashboard.py"),
    # POST /v1/ppr/batch and /v1/embeddings/batch
    "service/api/routes/batch.py": ("tests/test_batch_api.py", "tests/test_embedding_batch_api.py"),
    "service/api/routes/dashboard.py": ("tests/test_api_admin_dashboard.py",),
    # GET /v1/embeddings/{node} and /free/{node}
    "service/api/routes/embeddings.py": ("tests/test_embedding_api.py",),
    # GET /healthz and /metrics
    "service/api/routes/operations.py": ("tests/test_api.py", "tests/test_service_processes.py"),
    # POST /v1/admin/plan and /run-out
    "service/api/routes/planning.py": ("tests/test_plan_api.py",),
    # GET /v1/ppr, /v1/me/budget, /v1/me/reads
    "service/api/routes/ppr.py": ("tests/test_api.py", "tests/test_ranking_api.py"),
    # GET /v1/embeddings/similar/{node}
    "service/api/routes/similar.py": ("tests/test_similar_api.py",),
    # /v1/admin/synthetic
    "service/api/routes/synthetic.py": ("tests/test_api_synthetic.py",),
    # what a server process starts and stops
    "service/api/runtime.py": (
        "tests/test_api.py",
        "tests/test_promise.py",
        "tests/test_server_outlives.py",
    ),
    # body and header size limits
    "service/api/size_limits.py": ("tests/test_api_limits.py",),
    # the strict route class every router uses
    "service/api/strict.py": ("tests/test_api_strict.py",),
    "service/api/synthetic_models.py": ("tests/test_api_synthetic.py",),
    # the one durable-file writer, under the snapshot, the prefix table file and the batch sinks
    "service/atomic_files.py": (
        "tests/test_graph_snapshot.py",
        "tests/test_prefix_table.py",
        "tests/test_batch_lifetime.py",
    ),
    # workers that end with their driver
    "service/batch/lifetime.py": (
        "tests/test_batch_lifetime.py",
        "tests/test_batch_ray_lifetime.py",
    ),
    "service/batch/ray_reaper.py": ("tests/test_batch_ray_lifetime.py",),
    "service/batch/run.py": (
        "tests/test_batch.py",
        "tests/test_batch_embeddings.py",
        "tests/test_batch_lifetime.py",
    ),
    "service/batch/shared_graph.py": ("tests/test_batch_ray.py",),
    "service/batch/sinks.py": ("tests/test_batch.py", "tests/test_batch_lifetime.py"),
    "service/batch/spec.py": ("tests/test_batch.py", "tests/test_batch_embeddings.py"),
    # a block answered in a pool process
    "service/batch/worker.py": ("tests/test_batch.py", "tests/test_batch_embeddings.py"),
    # the bounds of ids, labels and budget ranges, refused at the API and the CLI
    "service/bounds.py": ("tests/test_api_edges.py", "tests/test_cli_errors.py"),
    "service/cache/byte_stores.py": ("tests/test_cache.py",),
    "service/cache/caches.py": ("tests/test_cache.py", "tests/test_planner.py"),
    "service/cache/codec.py": ("tests/test_cache.py",),
    # the hit/miss counters every typed cache shares
    "service/cache/counted.py": ("tests/test_cache.py",),
    # the builder process the prefix table suite starts
    "service/cache/prefix_table_builder.py": ("tests/test_prefix_table.py",),
    "service/cache/prefix_table_file.py": ("tests/test_prefix_table.py",),
    "service/cache/replay_cache.py": ("tests/test_cache.py",),
    # the parser and the one-line errors of every command
    "service/cli/__init__.py": ("tests/test_cli_errors.py", "tests/test_cli_help.py"),
    "service/cli/accounts.py": ("tests/test_accounts_cli.py",),
    # each bad value names its flag
    "service/cli/arg_types.py": ("tests/test_cli_errors.py",),
    "service/cli/batch.py": ("tests/test_batch.py", "tests/test_batch_embeddings.py"),
    "service/cli/bench.py": ("tests/test_engine_cli.py",),
    "service/cli/calibrate.py": ("tests/test_engine_cli.py",),
    "service/cli/classification.py": ("tests/test_classification_eval.py",),
    # the graph and mechanism arguments most commands share
    "service/cli/common.py": ("tests/test_engine_cli.py", "tests/test_evaluation.py"),
    "service/cli/db.py": ("tests/test_accounts_cli.py", "tests/test_cli_errors.py"),
    "service/cli/edge_report.py": ("tests/test_edge_report.py",),
    # `embeddings release`
    "service/cli/embeddings.py": ("tests/test_embedding_all_node_release.py",),
    "service/cli/evaluate.py": ("tests/test_evaluation.py", "tests/test_link_prediction.py"),
    "service/cli/evaluate_links.py": ("tests/test_link_prediction.py",),
    # `evaluate --task synthetic`
    "service/cli/evaluate_synthetic.py": ("tests/test_synthetic_graphs.py",),
    # `ledger edge-report`, `ledger verify`, `ledger reconcile`
    "service/cli/ledger.py": ("tests/test_edge_report.py", "tests/test_promise.py"),
    "service/cli/loadtest.py": ("tests/test_loadtest.py",),
    "service/cli/papers_driver.py": ("tests/unit/cli/test_papers_code.py",),
    "service/cli/plan.py": ("tests/test_budget_plan.py",),
    "service/cli/query.py": ("tests/test_engine_cli.py",),
    "service/cli/quickstart.py": ("tests/test_readme.py",),
    "service/cli/serve.py": (
        "tests/test_http_connections.py",
        "tests/test_service_processes.py",
        "tests/test_api_sandbox.py",
    ),
    "service/cli/soak.py": ("tests/test_soak.py",),
    "service/cli/synthesize.py": (
        "tests/test_synthetic_graphs.py",
        "tests/test_structural_sandbox.py",
    ),
    "service/client/calls.py": ("tests/test_client_rules.py", "tests/test_client.py"),
    "service/client/clients.py": ("tests/test_client.py", "tests/test_client_embeddings.py"),
    "service/client/embedding_calls.py": ("tests/test_client_embeddings.py",),
    "service/client/embedding_models.py": ("tests/test_client_embeddings.py",),
    "service/client/errors.py": ("tests/test_client_rules.py",),
    "service/client/models.py": ("tests/test_client.py",),
    "service/client/retry.py": ("tests/test_client_rules.py", "tests/test_client.py"),
    "service/config.py": ("tests/test_settings_parts.py", "tests/test_api_strict.py"),
    # through `ledger edge-report`
    "service/edge_report/report.py": ("tests/test_edge_report.py",),
    # the prefix shifts the per-edge curve is checked with
    "service/edge_report/shifts.py": ("tests/unit/privacy/test_per_edge.py",),
    "service/embeddings/all_node_release.py": (
        "tests/test_embedding_all_node_release.py",
        "tests/test_similar_api.py",
    ),
    "service/embeddings/all_nodes.py": ("tests/test_embedding_all_node_release.py",),
    "service/embeddings/dp.py": (
        "tests/test_embeddings.py",
        "tests/test_embedding_sensitivity.py",
        "tests/test_embedding_api.py",
    ),
    "service/embeddings/free.py": ("tests/test_embeddings.py",),
    "service/embeddings/hashing.py": (
        "tests/test_embeddings.py",
        "tests/test_embedding_salts.py",
        "tests/test_embedding_sensitivity.py",
    ),
    "service/embeddings/instant.py": (
        "tests/test_embeddings.py",
        "tests/test_embedding_sensitivity.py",
        "tests/test_pushflowcap_kernel.py",
    ),
    "service/embeddings/noise_free.py": ("tests/test_pushflowcap_kernel.py",),
    "service/embeddings/parameters.py": (
        "tests/test_embeddings.py",
        "tests/test_embedding_sensitivity.py",
    ),
    "service/embeddings/similar.py": (
        "tests/test_embedding_all_node_release.py",
        "tests/test_similar_api.py",
    ),
    # the error classes; every code has a typed client error
    "service/errors.py": ("tests/test_client_rules.py", "tests/test_api_strict.py"),
    "service/evaluation/classification.py": ("tests/test_classification_eval.py",),
    # the embedding comparison behind `evaluate --task classification`
    "service/evaluation/embeddings.py": ("tests/test_classification_eval.py",),
    "service/evaluation/links.py": ("tests/test_link_prediction.py",),
    "service/evaluation/metrics.py": ("tests/test_evaluation.py",),
    "service/evaluation/options.py": ("tests/test_evaluation.py", "tests/test_link_prediction.py"),
    "service/evaluation/runner.py": ("tests/test_evaluation.py", "tests/test_budget_plan.py"),
    "service/evaluation/synthetic.py": (
        "tests/test_synthetic_graphs.py",
        "tests/test_synthetic_exact_noise.py",
    ),
    "service/graph/build.py": ("tests/unit/graph/test_loader.py", "tests/test_graph_generate.py"),
    "service/graph/configured.py": ("tests/test_graph_snapshot.py", "tests/test_prefix_table.py"),
    "service/graph/demo.py": ("tests/test_graph_generate.py",),
    # reading and decompressing an edge-list file, behind load_edge_list
    "service/graph/edge_file.py": ("tests/unit/graph/test_loader.py",),
    "service/graph/edge_tokens.py": ("tests/unit/graph/test_loader.py",),
    "service/graph/generate.py": ("tests/test_graph_generate.py",),
    "service/graph/model.py": ("tests/test_graph_generate.py", "tests/unit/graph/test_loader.py"),
    "service/graph/node_ids.py": (
        "tests/test_graph_snapshot.py",
        "tests/unit/ledger/test_release_format.py",
    ),
    "service/graph/node_set.py": ("tests/test_structural_node_count.py",),
    "service/graph/public_bounds.py": ("tests/unit/mechanisms/test_diffusion.py",),
    "service/graph/snapshot.py": ("tests/test_graph_snapshot.py",),
    # the dashboard's account list
    "service/ledger/account_listing.py": ("tests/test_api_admin_dashboard.py",),
    # an account's curve, charges and usage on the dashboard
    "service/ledger/account_views.py": ("tests/test_api_admin_dashboard.py",),
    "service/ledger/accounts.py": ("tests/test_ledger.py", "tests/test_api_admin_dashboard.py"),
    # usage per hour, refusals by reason, in flight
    "service/ledger/admin_activity.py": ("tests/test_api_admin_dashboard.py",),
    "service/ledger/admin_records.py": ("tests/test_api_admin_dashboard.py",),
    "service/ledger/admin_views.py": ("tests/test_api_admin_dashboard.py",),
    # admit_and_charge, alone, under contention and in groups
    "service/ledger/admission.py": (
        "tests/test_ledger.py",
        "tests/test_ledger_concurrency.py",
        "tests/test_ledger_groups.py",
    ),
    # the checks admit_and_charge makes under its row locks
    "service/ledger/admission_rules.py": (
        "tests/test_ledger.py",
        "tests/test_ledger_concurrency.py",
    ),
    "service/ledger/api_keys.py": ("tests/test_ledger.py", "tests/test_api_admin_dashboard.py"),
    # the audit log page
    "service/ledger/audit_view.py": ("tests/test_api_admin_dashboard.py",),
    "service/ledger/budgets.py": ("tests/test_ledger.py",),
    "service/ledger/database.py": ("tests/test_ledger.py", "tests/test_migration_chain.py"),
    "service/ledger/embedding_salts.py": ("tests/test_embedding_salts.py",),
    # GET /v1/admin/exposure
    "service/ledger/exposure.py": ("tests/test_api_admin_dashboard.py",),
    # the graph-level releases (degrees, all-node embeddings) and their charges
    "service/ledger/graph_releases.py": (
        "tests/test_degree_and_read_charges.py",
        "tests/test_sampler_share.py",
        "tests/test_embedding_all_node_release.py",
    ),
    # the graph version every worker serves
    "service/ledger/graph_versions.py": (
        "tests/test_graph_follow.py",
        "tests/test_api_admin_dashboard.py",
    ),
    "service/ledger/group_reads.py": ("tests/test_group_reads.py",),
    "service/ledger/idempotency.py": ("tests/test_idempotency_binding.py", "tests/test_ledger.py"),
    "service/ledger/keys.py": ("tests/test_ledger.py",),
    "service/ledger/ledger.py": ("tests/test_ledger.py", "tests/test_ledger_concurrency.py"),
    "service/ledger/locked_rows.py": ("tests/test_ledger.py", "tests/test_live_charges.py"),
    # the service quota and the degree charges
    "service/ledger/quota_and_degree.py": ("tests/test_degree_and_read_charges.py",),
    # what a service account has read
    "service/ledger/read_figures.py": (
        "tests/test_degree_and_read_charges.py",
        "tests/test_api_admin_dashboard.py",
    ),
    "service/ledger/records.py": ("tests/test_ledger.py", "tests/test_ledger_groups.py"),
    # POST /v1/admin/run-out
    "service/ledger/run_out.py": ("tests/test_plan_api.py",),
    "service/ledger/settlement.py": (
        "tests/test_ledger.py",
        "tests/test_live_charges.py",
        "tests/test_promise.py",
    ),
    "service/ledger/stored_releases.py": (
        "tests/test_ledger.py",
        "tests/test_idempotency_binding.py",
    ),
    "service/ledger/synthesis_jobs.py": ("tests/test_synthesis_jobs.py",),
    "service/ledger/tables.py": ("tests/test_ledger.py", "tests/test_edge_report.py"),
    "service/ledger/transactions.py": ("tests/test_ledger.py", "tests/test_ledger_concurrency.py"),
    # `ledger verify`, run after each crash and duplicate
    "service/ledger/verification.py": ("tests/test_promise.py",),
    "service/loadtest/httpx_driver.py": ("tests/test_loadtest.py",),
    "service/loadtest/report.py": ("tests/test_loadtest.py", "tests/test_soak.py"),
    "service/loadtest/run.py": ("tests/test_loadtest.py",),
    # the service the load test starts
    "service/loadtest/server.py": ("tests/test_loadtest.py", "tests/test_soak.py"),
    "service/loadtest/soak.py": ("tests/test_soak.py",),
    "service/loadtest/workload.py": ("tests/test_loadtest.py", "tests/test_soak.py"),
    "service/loadtest/wrk_driver.py": ("tests/test_loadtest.py",),
    # serve's JSON log line, read from its stderr
    "service/logs.py": ("tests/test_http_connections.py",),
    "service/mechanisms/blended.py": (
        "tests/test_ranking_sensitivity.py",
        "tests/unit/mechanisms/test_lazy_blend.py",
        "tests/test_ranking_api.py",
    ),
    "service/mechanisms/charges.py": ("tests/test_budget_plan.py",),
    "service/mechanisms/common_neighbours.py": (
        "tests/test_ranking_sensitivity.py",
        "tests/test_laplace_mechanisms.py",
        "tests/unit/mechanisms/test_lazy_top_k.py",
    ),
    # the Bernoulli draws under the exact Laplace sampler
    "service/mechanisms/exact_bernoulli.py": ("tests/unit/mechanisms/test_exact_laplace.py",),
    # the rare paths of the exact Laplace sampler (ties on whole words, the chain of a zero
    # gate, a cell boundary inside y's first word), run against the sampler's reference
    "service/mechanisms/exact_words.py": ("tests/unit/mechanisms/test_exact_laplace.py",),
    "service/mechanisms/friends_of_friends.py": (
        "tests/test_ranking_sensitivity.py",
        "tests/unit/mechanisms/test_lazy_top_k.py",
    ),
    # the grid step the engine runs, checked bit for bit there
    "service/mechanisms/grid_noise.py": ("tests/unit/mechanisms/test_engine.py",),
    "service/mechanisms/operator.py": (
        "tests/unit/mechanisms/test_engine.py",
        "tests/unit/privacy/test_state_grid.py",
        "tests/test_float_safety.py",
    ),
    # constants only: the published parameters pushflowcap and edge_flipping run with
    "service/mechanisms/parameters.py": (
        "tests/unit/mechanisms/test_pushflowcap.py",
        "tests/unit/mechanisms/test_edge_flipping.py",
    ),
    "service/mechanisms/popular.py": (
        "tests/test_laplace_mechanisms.py",
        "tests/test_sampler_share.py",
    ),
    "service/mechanisms/prefix_table.py": ("tests/test_prefix_table.py",),
    # the benchmark's naive diffusion, run by `bench`
    "service/mechanisms/reference.py": ("tests/test_engine_cli.py",),
    "service/mechanisms/registry.py": (
        "tests/test_ranking_sensitivity.py",
        "tests/test_ranking_api.py",
    ),
    "service/planning/budget.py": ("tests/test_budget_plan.py", "tests/test_plan_api.py"),
    "service/planning/quality.py": ("tests/test_budget_plan.py",),
    "service/privacy/accountant.py": ("tests/test_privacy_math.py",),
    "service/privacy/calibration.py": ("tests/test_privacy_math.py",),
    "service/privacy/curves.py": ("tests/test_privacy_math.py",),
    # the sampler's curve is checked with its law
    "service/privacy/discrete_gaussian.py": ("tests/unit/mechanisms/test_discrete_gaussian.py",),
    "service/privacy/floating.py": (
        "tests/test_float_safety.py",
        "tests/unit/privacy/test_state_grid.py",
    ),
    "service/privacy/horizon.py": ("tests/test_budget_plan.py", "tests/test_plan_api.py"),
    "service/privacy/laplace.py": (
        "tests/test_laplace_mechanisms.py",
        "tests/test_ranking_sensitivity.py",
    ),
    "service/privacy/modes.py": ("tests/test_privacy_math.py",),
    "service/privacy/orders.py": ("tests/test_privacy_math.py",),
    "service/privacy/sampler.py": (
        "tests/test_sampler_share.py",
        "tests/test_laplace_mechanisms.py",
    ),
    "service/privacy/synthetic.py": (
        "tests/unit/synthetic/test_privdpr.py",
        "tests/unit/synthetic/test_triangles.py",
        "tests/test_synthetic_graphs.py",
    ),
    "service/release_payload.py": (
        "tests/test_synthetic_graphs.py",
        "tests/test_embedding_all_node_release.py",
    ),
    "service/serving/batch.py": ("tests/test_batch_api.py", "tests/test_embedding_batch_api.py"),
    "service/serving/coalescer.py": ("tests/test_coalescer.py",),
    # GET /v1/embeddings/{node} and its batch
    "service/serving/dp_embeddings.py": (
        "tests/test_embedding_api.py",
        "tests/test_embedding_batch_api.py",
    ),
    "service/serving/embedding_batch.py": ("tests/test_embedding_batch_api.py",),
    "service/serving/embedding_query.py": ("tests/test_embedding_api.py",),
    "service/serving/embedding_schemas.py": (
        "tests/test_embedding_api.py",
        "tests/test_embedding_batch_api.py",
    ),
    "service/serving/embedding_spaces.py": ("tests/test_embedding_api.py",),
    "service/serving/graph_holder.py": (
        "tests/test_graph_follow.py",
        "tests/test_graph_snapshot.py",
    ),
    "service/serving/graph_identity.py": (
        "tests/test_prefix_table.py",
        "tests/test_sampler_share.py",
    ),
    "service/serving/group_commit.py": ("tests/test_ledger_groups.py",),
    "service/serving/limits.py": ("tests/test_api_limits.py",),
    "service/serving/live_charges.py": ("tests/test_live_charges.py",),
    # the GET /v1/ppr and batch path, stage by stage
    "service/serving/pipeline/admit.py": ("tests/test_api.py", "tests/test_refused_batches.py"),
    "service/serving/pipeline/answer.py": ("tests/test_api.py",),
    "service/serving/pipeline/draw.py": ("tests/test_api.py", "tests/test_api_refresh_policy.py"),
    # the 409 request_in_progress a concurrent twin gets
    "service/serving/pipeline/errors.py": (
        "tests/test_promise.py",
        "tests/test_embedding_batch_api.py",
    ),
    # the graph-wide cap read by the degree release (prepare) and by every admission (admit)
    "service/serving/pipeline/graph_caps.py": (
        "tests/test_ranking_api.py",
        "tests/test_promise.py",
    ),
    "service/serving/pipeline/group.py": ("tests/test_api.py", "tests/test_refused_batches.py"),
    "service/serving/pipeline/items.py": ("tests/test_api.py",),
    # the admission policy read from the settings
    "service/serving/pipeline/policy.py": ("tests/test_api.py",),
    # the noise-free prefixes a group of queries reads
    "service/serving/pipeline/prefixes.py": (
        "tests/test_api.py",
        "tests/test_api_refresh_policy.py",
    ),
    "service/serving/pipeline/prepare.py": ("tests/test_api.py", "tests/test_refused_batches.py"),
    # the reads a group of admissions makes once
    "service/serving/pipeline/reads.py": ("tests/test_api.py", "tests/test_api_refresh_policy.py"),
    "service/serving/pipeline/refusals.py": ("tests/test_refused_batches.py", "tests/test_api.py"),
    # a stored release answered again
    "service/serving/pipeline/replay.py": (
        "tests/test_api.py",
        "tests/test_api_refresh_policy.py",
        "tests/test_idempotency_binding.py",
    ),
    "service/serving/pipeline/results.py": ("tests/test_api.py",),
    "service/serving/pipeline/store.py": ("tests/test_api.py", "tests/test_live_charges.py"),
    "service/serving/planner.py": ("tests/test_planner.py", "tests/test_batch.py"),
    # one GET /v1/ppr: authorize, admit, release, store
    "service/serving/ppr_query.py": ("tests/test_api.py", "tests/test_api_refresh_policy.py"),
    "service/serving/prefix_tables.py": ("tests/test_prefix_table.py",),
    "service/serving/rankings.py": (
        "tests/test_ranking_api.py",
        "tests/test_ranking_sensitivity.py",
        "tests/test_degree_and_read_charges.py",
    ),
    "service/serving/reconciler.py": ("tests/test_synthesis_jobs.py", "tests/test_promise.py"),
    # the last serves it from uvicorn worker processes
    "service/serving/sandbox.py": (
        "tests/test_sandbox_charges.py",
        "tests/test_api_sandbox.py",
        "tests/test_structural_sandbox.py",
    ),
    "service/serving/schemas.py": ("tests/test_coalescer.py", "tests/test_embedding_batch_api.py"),
    # every field in one part; the table in docs/configuration.md (test_readme)
    "service/settings/batch.py": ("tests/test_settings_parts.py",),
    "service/settings/cache.py": ("tests/test_settings_parts.py",),
    "service/settings/embeddings.py": ("tests/test_settings_parts.py",),
    "service/settings/graph.py": ("tests/test_settings_parts.py",),
    "service/settings/http.py": ("tests/test_settings_parts.py",),
    "service/settings/ledger.py": ("tests/test_settings_parts.py",),
    "service/settings/mechanism.py": ("tests/test_settings_parts.py",),
    "service/settings/privacy.py": ("tests/test_settings_parts.py",),
    "service/settings/serving.py": ("tests/test_settings_parts.py",),
    # the evaluation's floors, under `evaluate --task synthetic`
    "service/synthetic/baselines.py": ("tests/test_synthetic_graphs.py",),
    "service/synthetic/blocks.py": (
        "tests/unit/synthetic/test_anchors.py",
        "tests/unit/synthetic/test_triangles.py",
    ),
    "service/synthetic/communities.py": (
        "tests/test_synthetic_graphs.py",
        "tests/unit/synthetic/test_deconvolve.py",
    ),
    "service/synthetic/jobs.py": ("tests/test_synthesis_jobs.py",),
    # the generators' Laplace releases
    "service/synthetic/noise.py": ("tests/test_synthetic_exact_noise.py",),
    "service/synthetic/release.py": (
        "tests/test_synthetic_graphs.py",
        "tests/test_synthesis_jobs.py",
    ),
    "service/synthetic/sampling.py": (
        "tests/test_synthetic_graphs.py",
        "tests/unit/synthetic/test_order_shrinkage.py",
    ),
    # the database and Redis URL checks, each bad URL refused in one line
    "service/urls.py": ("tests/test_cli_errors.py",),
}
