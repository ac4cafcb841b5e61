"""The heterogeneous host runtime: device config, sync/overlap pipelines, timelines, projection, batching.

Modules: `device_config` (YAML -> DeviceConfig), `pipeline` (run_pipeline), `timeline` (TimelineEvent,
Timeline), `projection` (measured vs board-projected end-to-end time), `batch` (run_batch), `adaptive`
(AdaptiveDraftLength). Import from the modules; this package file stays empty so importing one part never
loads the others.
"""
