"""Generation pieces shared by every backend: detokenization, stop strings, sampling."""
