"""Build the worker image and run what a deploy ships, without a Docker engine.

- :mod:`.base`: the local stand-in for the Dockerfile's ``FROM``, made from Debian's
  packages and cached outside the repository;
- :mod:`.build`: the image, from the real Dockerfile over the staged context (buildah);
- :mod:`.task_definition` and :mod:`.oci`: a synthesized container definition, and the
  runtime spec that runs the image exactly as it says (runc);
- :mod:`.container`: one running container: health command, SIGTERM, exit status;
- :mod:`.lambda_asset`: the router's Lambda asset in a runtime-like virtualenv;
- :mod:`.lock`: worker/requirements.lock, from the pins, with hashes.

``scripts/image.sh`` is the command line (``python -m scripts.fleet_image``).
"""
