"""2-D multi-agent driving world (shapely geometry, kinematic bicycle, IDM + pure-pursuit traffic).

Modules: ``geometry`` (polylines, oriented boxes, frames), ``maps`` (procedural road layouts),
``world`` (seeded scenarios with OOD splits, traffic simulation, ``check_trajectory``,
``expert_trajectory``), ``render`` (ego-centred BEV raster). No gymnasium env is registered yet.
"""
