"""Stage 9, the runner: a whole replay. Settings, the server checked, the planned steps then the
search, the identity of what was measured, and the results saved after every step. It only
orchestrates: each decision belongs to an earlier stage. Hands on `ReplayResults`."""
