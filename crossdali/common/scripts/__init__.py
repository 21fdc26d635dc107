"""Training-script plumbing, the same for every framework: how a script runs and exits, its flags and
parsers, the defaults it takes from the machine, its run folder, metrics and progress."""
