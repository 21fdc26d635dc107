"""Where samples come from and whether they can be read: the on-disk formats, the sources of each
task's splits, ``crossdali check`` and the embedded sample sets. Imports nothing above it."""
