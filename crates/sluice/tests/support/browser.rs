//! A headless Chromium driven through chromedriver (Debian's `chromium` and `chromium-driver`,
//! which `scripts/testdb install` installs), with blocking calls for tests: each waits on what
//! the page shows, never on time alone.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};

use super::cluster::free_port;
use super::Guard;

pub struct Browser {
    runtime: tokio::runtime::Runtime,
    client: Option<Client>,
    _driver: Guard,
}

/// How long a step waits for the page.
const PATIENCE: Duration = Duration::from_secs(30);

impl Browser {
    pub fn start() -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts (apt-get install chromium chromium-driver; scripts/testdb install does)");
        let driver = Guard::new(driver);
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let capabilities: serde_json::Map<String, serde_json::Value> = serde_json::from_value(serde_json::json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,1000", "--lang=en-US"]
            }
        }))
        .unwrap();
        let deadline = Instant::now() + PATIENCE;
        let client = loop {
            let attempt = runtime.block_on(
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                    .capabilities(capabilities.clone())
                    .connect(&format!("http://127.0.0.1:{port}")),
            );
            match attempt {
                Ok(client) => break client,
                Err(error) if Instant::now() < deadline => {
                    let _ = error;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(error) => panic!("no browser session through chromedriver: {error}"),
            }
        };
        Browser { runtime, client: Some(client), _driver: driver }
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("a session")
    }

    pub fn goto(&self, url: &str) {
        self.runtime.block_on(self.client().goto(url)).unwrap_or_else(|error| panic!("goto {url}: {error}"));
    }

    /// Waits for an element, then clicks it.
    pub fn click(&self, css: &str) {
        self.runtime
            .block_on(async {
                let element = self.client().wait().at_most(PATIENCE).for_element(Locator::Css(css)).await;
                element.unwrap_or_else(|error| panic!("no {css} to click: {error}")).click().await
            })
            .unwrap_or_else(|error| panic!("click {css}: {error}"));
    }

    /// Waits for the page's confirmation dialog, then accepts it ("OK").
    pub fn accept_dialog(&self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.runtime.block_on(self.client().accept_alert()) {
                Ok(()) => return,
                Err(error) => assert!(Instant::now() < deadline, "no dialog to accept: {error}"),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for an input, then types into it.
    pub fn type_into(&self, css: &str, text: &str) {
        self.runtime
            .block_on(async {
                let element = self.client().wait().at_most(PATIENCE).for_element(Locator::Css(css)).await;
                let element = element.unwrap_or_else(|error| panic!("no {css} to type into: {error}"));
                element.clear().await?;
                element.send_keys(text).await
            })
            .unwrap_or_else(|error| panic!("type into {css}: {error}"));
    }

    /// Sets a text area's whole value as a paste would, and tells the page it changed.
    pub fn paste(&self, css: &str, text: &str) {
        self.runtime
            .block_on(async {
                self.client().wait().at_most(PATIENCE).for_element(Locator::Css(css)).await?;
                let script = "const area = document.querySelector(arguments[0]); area.value = arguments[1]; \
                          area.dispatchEvent(new Event('input', {bubbles: true}));";
                self.client().execute(script, vec![css.into(), text.into()]).await.map(|_| ())
            })
            .unwrap_or_else(|error| panic!("paste into {css}: {error}"));
    }

    /// The text of the first element matching `css`, or `None` when there is none.
    pub fn text(&self, css: &str) -> Option<String> {
        self.runtime.block_on(async {
            let element = self.client().find(Locator::Css(css)).await.ok()?;
            element.text().await.ok()
        })
    }

    /// Waits until the element's text satisfies `wanted`; its text.
    pub fn wait_text(&self, css: &str, limit: Duration, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let text = self.text(css);
            if text.as_deref().is_some_and(&wanted) {
                return text.unwrap();
            }
            assert!(Instant::now() < deadline, "{css} never showed what was expected; it shows {text:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The current URL.
    pub fn url(&self) -> String {
        self.runtime.block_on(self.client().current_url()).map(|url| url.to_string()).unwrap_or_default()
    }

    /// Saves a PNG of the page.
    pub fn screenshot(&self, path: &Path) {
        let png = self.runtime.block_on(self.client().screenshot()).expect("a screenshot");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let _ = self.runtime.block_on(client.close());
        }
    }
}
