() => {
  // The Step grid scrolls sideways on a narrow screen: each grid says on which sides more positions lie
  // (data-more-left, data-more-right: assets/style.css fades that edge and says so in the heading).
  const mark = (wrap) => {
    const left = wrap.scrollLeft > 1, right = wrap.scrollLeft + wrap.clientWidth < wrap.scrollWidth - 1;
    wrap.toggleAttribute("data-more-left", left);
    wrap.toggleAttribute("data-more-right", right);
  };
  const markAll = () => document.querySelectorAll(".token-grid-wrap").forEach(mark);
  document.addEventListener("scroll", (event) => {
    if (event.target instanceof Element && event.target.matches(".token-grid-wrap")) mark(event.target);
  }, true);
  window.addEventListener("resize", markAll);
  new MutationObserver(markAll).observe(document.body, {childList: true, subtree: true});
  // The charts follow the page's theme (Gradio's .dark class): each figure carries its dark colours (a template and
  // one colour patch per trace, in layout.meta.dark: components/theme.py), used when the page is dark. Gradio draws
  // every figure with Plotly.react, wrapped here as soon as plotly loads (window.Plotly is set when it does).
  const isDark = () => document.body.classList.contains("dark") || document.documentElement.classList.contains("dark");
  const plain = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  const merge = (base, patch) => {
    if (!plain(base) || !plain(patch)) return patch === undefined ? base : patch;
    const out = {...base};
    for (const [key, value] of Object.entries(patch)) out[key] = merge(base[key], value);
    return out;
  };
  const themed = (data, layout) => {
    const dark = plain(layout) && plain(layout.meta) ? layout.meta.dark : undefined;
    if (!dark || !isDark() || !Array.isArray(data)) return [data, layout];
    return [data.map((trace, i) => merge(trace, (dark.data || [])[i] || {})), {...layout, template: dark.template}];
  };
  const wrap = (plotly) => {
    if (!plotly || typeof plotly.react !== "function" || plotly.react.themed) return;
    const react = plotly.react;
    plotly.react = function (gd, data, layout, config) {
      return react.call(this, gd, ...themed(data, layout), config);
    };
    plotly.react.themed = true;
    document.querySelectorAll(".js-plotly-plot").forEach((gd) => {
      if (gd.data) plotly.react(gd, gd.data, gd.layout);  // drawn before plotly was wrapped: drawn again
    });
  };
  if (window.Plotly) wrap(window.Plotly);
  else {
    let loaded;
    const set = (v) => { loaded = v; wrap(v); };
    Object.defineProperty(window, "Plotly", {configurable: true, get: () => loaded, set});
  }
  // On a narrow screen (a phone) the page starts with the settings sidebar closed: open, it covers the whole page.
  // The sidebar appears once Gradio has drawn the page; look for it a few times.
  markAll();
  if (!window.matchMedia("(max-width: 768px)").matches) return;
  const close = (tries) => {
    const sidebar = document.querySelector("#settings-sidebar");
    if (sidebar === null) {
      if (tries > 0) setTimeout(() => close(tries - 1), 100);
      return;
    }
    if (sidebar.classList.contains("open")) sidebar.querySelector(".toggle-button")?.click();
  };
  close(100);
}
