"""The "Retraining" view in the Airflow UI: one row per partition-run of a retraining DAG.

Layered so that most of it is pure and fast to test: :mod:`.records` (what a run left, as plain
data), :mod:`.model` (records -> the view model: filters, decisions, cost, paging), :mod:`.plots`
and :mod:`.page` (the view model -> SVG and HTML), :mod:`.sources` (Airflow's metadata and MLflow
-> records), :mod:`.app` (the FastAPI routes, behind Airflow's own authentication) and
:mod:`.registration` (what the plugin registers; imports nothing heavy).
"""
