"""Whole recommendation models at TorchRec's paths (`torchrec.models`): DLRM, DLRM_DCN, DLRM_Projection,
SimpleDeepFMNN (and the Wrapper forms that take one ModelInput)."""

from rectoolkit.models.deepfm import SimpleDeepFMNN, SimpleDeepFMNNWrapper
from rectoolkit.models.dlrm import DLRM, DLRM_DCN, DLRM_Projection

__all__ = ["DLRM", "DLRM_DCN", "DLRM_Projection", "SimpleDeepFMNN", "SimpleDeepFMNNWrapper"]
