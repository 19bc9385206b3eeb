"""The Chameleon node: provisioning helpers (`chameleon`), the Compose stacks' helpers (`compose`) and
the instructor's pre-flight check (`doctor`), the lease clock, the shipped configs' restore, the
trained model's checked download (`weights`), the notebooks run inside the Jupyter container with
their node commands (`labrun`, shared with the compose check) and the node's reference run
(`reference`). Standard-library Python only: it runs on the node's bare python3
(`python3 -m servelab.node.doctor`)."""
