"""The benchmark and what the app's Sweep and This-machine tabs run on top of it: the prompt suite, the runs table,
the timed peer (transformers), analysis, train/test standing, the heatmap, the reports, the DISCO classifier's
training, the Sweep service, the machine profile, and their subcommands (``commands``)."""
