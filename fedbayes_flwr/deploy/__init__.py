"""A one-command Flower deployment on this machine: TLS and node keys, processes and their
watchdog, Flower's CLI, the run itself. Drives Flower's commands as subprocesses; never imports flwr.
"""
