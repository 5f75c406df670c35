"""``python -m packed_ss.train``: the model-training command line the model cards cite; the code is in
:mod:`packed_ss.training.train`."""

from packed_ss.training.train import main

if __name__ == "__main__":
    main()
