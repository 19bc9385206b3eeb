"""The Chameleon node: provisioning helpers (`chameleon`), the Compose stacks' helpers (`compose`) and
the instructor's pre-flight check (`doctor`), the lease clock, the shipped configs' restore and the
trained model's checked download (`weights`). Standard-library Python only: it runs on the node's
bare python3 (`python3 -m servelab.node.doctor`)."""
